"""Sustained Kafka -> PostgreSQL throughput of the ingester, for batch sizes 100 / 1,000 / 5,000.

    eval "$(shadow-ab services env)"
    python bench/ingest.py [--records N] [--batch-sizes 100,1000,5000] [--workers 1,2]
                           [--decoder pydantic,msgspec,rows] [--inflight 1,2]
                           [--gc tuned|default|both] [--fetch-partition-kb 8192] [--repeat R]
                           [--top-logprobs K] [--no-parts] [--profile]

Needs `shadow-ab services up` and its SHADOW_AB_* variables in the environment.

The records (``make_values``): N exchange records as the mirror sends them, a third each
incumbent / candidate / replay, streamed chat completions. Each carries 1-4 KB of text in
total (uniform), split 30-70 % / 70-30 % between the user prompt (in ``request.messages``,
after a one-line system prompt) and ``output_text``; the words come from a 45-word vocabulary.
``itl_s`` has one inter-token latency per SSE event after the first, assuming 4 characters a
token and 2 tokens an event (about 40-360 floats, 6 decimals); ``request`` also carries model,
max_tokens, temperature, top_p, seed, stream and stream_options; plus the scalar timings,
token counts, in-flight counts and a guard dict; no logprobs unless ``--top-logprobs K``:
then the candidate's and the replay's records carry one entry per 4 characters of output with
K alternatives, as the mirror asks for them (``shadow.top_logprobs``, 5 by default; about
31.6 KB of JSON a record on average with 5). The table prints the mean JSON size (about 4.8
KB without logprobs: about 2.6 KB of text, the rest mostly ITL floats and field names).

They are produced to a fresh 6-partition topic (as ``shadow.exchanges``); then, for each batch
size and worker count, ``--workers`` processes each run the real ingester exactly as
``shadow-ab ingest --workers N`` does (the confluent-kafka consumer, decode + validation,
binary COPY into PostgreSQL, offset commit after the store commit; ``tune_gc`` unless
``--gc default``) in one fresh consumer group, into a fresh database, until every offset is
committed; the row count is then checked to be exactly N.

``--decoder``, ``--inflight`` and ``--fetch-partition-kb`` compare the ingester's decoders
(``SHADOW_AB_INGEST_DECODER``) and batches in flight per worker
(``SHADOW_AB_INGEST_INFLIGHT_BATCHES``) side by side; the
"vs first" column is each row's rate over the first row's (list the old configuration first:
``--decoder msgspec,rows --inflight 1,2``), measured in the same run on the same records. The
decoders run back to back on each setting, and "vs <first decoder>" is each row's rate over
the first decoder's on the same setting (``rows``, the default, over ``msgspec``, the decoder
before it: msgspec straight to the store's row values against msgspec into the records).

The measurement starts once every worker holds partitions (so joining the group and the
rebalances as workers join are excluded; they are printed apart as "startup") and counts the
records committed from then on ("records measured"). The CPU columns split the machine's CPU
time over that window per record: the ingester workers (all their threads: librdkafka's too),
PostgreSQL (every process of the server: other databases' work included), "pg db" (only the
server backends of this run's database: the ingesters' connections), Kafka (java), every
other process, and idle (including I/O wait); 2 cores give 2 CPU-seconds a second. "load"
is the machine's 1-minute load average, sampled through the run (mean and highest): other
work on a shared machine shows there ("other" is the change in the CPU of every process alive
at the end: processes that end within the run make it low, or even negative).

Then (unless ``--no-parts``) it measures the floors, each part alone on the same records, one
after the other in the same run: fetching from Kafka (the consumer's poll through the
ingester's adapter, ``ingester.clients``, for each ``--fetch-partition-kb``; the process's CPU
counts every thread, librdkafka's too), decode + validation (each decoder; ``rows`` includes
making the row values), and the store write (storage.write.write_exchanges) split into
building the rows (``exchange_values``, the binary wire values), the COPY and commit on the
client side (the write's CPU less the rows'), and PostgreSQL's CPU for it (the backend's own
process), then the same write of the ``rows`` decoder's rows (no rows to build), with the
records/s one core would reach doing only that part.
``--profile`` prints each worker's top functions (cProfile) for the 1,000 batch size.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import random
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import make_url

from ingester.app import build_processor, tune_gc
from ingester.batch import Partition
from ingester.clients import make_consumer, make_producer
from ingester.decode import decode
from ingester.settings import IngestSettings
from shadow_ab.dev.synthetic import text_of
from shadow_ab.records import ExchangeRecord, parse_record
from shadow_ab.settings import CommonSettings
from shadow_ab.topics import TopicSpec, delete_topics, ensure_topics
from storage.db import make_engine, normalize_url
from storage.migrate import upgrade
from storage.write import WIRE, ExchangeRow, exchange_values, write_exchanges

GOAL = 10_000
PARTITIONS = 6  # as shadow.exchanges
CPU_GROUPS = ("ingester", "postgres", "pg db", "kafka", "other", "idle")
DECODERS = ("pydantic", "msgspec", "rows")
WORDS = (
    "the of and to in is that for it as with was on be by this are or at from an which have"
    " latency token model engine batch request response stream cache memory decode prefill"
    " kernel throughput attention tensor shadow candidate incumbent replay sample policy"
).split()


# -- realistic records ------------------------------------------------------------------------


def make_values(
    n: int, deployment: str, seed: int = 1, top_logprobs: int = 0
) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs of exchange records as the mirror would send them; with
    ``top_logprobs`` the candidate's and the replay's carry logprobs as the mirror asks for them
    (``shadow.top_logprobs``, 5 by default): one entry per output token, its
    ``top_logprobs`` alternatives (its own token among them)."""
    rng = random.Random(seed)
    t0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
    out = []
    for i in range(n):
        pair = uuid.UUID(int=rng.getrandbits(128), version=4)
        role = ("incumbent", "candidate", "replay")[i % 3]
        # 1-4 KB of text per record in total, split between the prompt and the output.
        text_bytes = rng.randint(1024, 4096)
        prompt_bytes = int(text_bytes * rng.uniform(0.3, 0.7))
        prompt = text_of(prompt_bytes, rng, WORDS)
        output = text_of(text_bytes - prompt_bytes, rng, WORDS)
        tokens = max(2, len(output) // 4)
        events = max(2, tokens // 2)  # engines stream one or a few tokens per SSE event
        ttft = rng.uniform(0.03, 0.4)
        itl = [round(rng.uniform(0.006, 0.05), 6) for _ in range(events - 1)]
        e2e = ttft + sum(itl)
        obj: dict[str, Any] = {
            "schema_version": 1,
            "kind": "exchange",
            "deployment": deployment,
            "pair_id": str(pair),
            "role": role,
            "engine": "vllm@incumbent" if role != "candidate" else "trtllm@candidate",
            "endpoint": "chat",
            "stream": True,
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "sent_at": (t0 + timedelta(milliseconds=i)).isoformat(),
            "status": "ok",
            "http_status": 200,
            "ttft_s": round(ttft, 6),
            "e2e_s": round(e2e, 6),
            "tpot_s": round((e2e - ttft) / (tokens - 1), 6),
            "itl_s": itl,
            "prompt_tokens": len(prompt) // 4,
            "completion_tokens": tokens,
            "finish_reason": "stop",
            "request": {
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": prompt},
                ],
                "max_tokens": 1024,
                "temperature": 0.0,
                "top_p": 1.0,
                "seed": 1234,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            "rewrites": [],
            "output_text": output,
            "inflight_incumbent": rng.randint(0, 64),
            "inflight_candidate": rng.randint(0, 16),
            "guard": {"state": "open"},
        }
        if top_logprobs and role != "incumbent":
            obj["logprobs"] = _logprobs(output, top_logprobs, rng)
        out.append((str(pair).encode(), orjson.dumps(obj)))
    for _, value in out[:2]:
        parse_record(value)  # the generator keeps to the record contract
    return out


def _logprobs(output: str, top: int, rng: random.Random) -> list[dict[str, Any]]:
    """Per token (4 characters of ``output``, so they spell it) its logprob and ``top``
    alternatives, as the mirror records them (``shadow_ab.records.TokenLogprob``)."""
    out = []
    for i in range(0, len(output), 4):
        token = output[i : i + 4]
        own = round(-rng.expovariate(4.0), 6)
        alts = {token: own}
        while len(alts) < top:
            alts[rng.choice(WORDS)[:4]] = round(own - rng.expovariate(0.5), 6)
        out.append({"token": token, "logprob": own, "top": alts})
    return out


def _parsed(values: list[tuple[bytes, bytes]]) -> list[ExchangeRecord]:
    return [ExchangeRecord.model_validate_json(v) for _, v in values]


def _prompt(rec: ExchangeRecord) -> str:
    return "".join(m["content"] for m in rec.request["messages"] if m["role"] == "user")


# -- services ----------------------------------------------------------------------------------


class FreshDatabases:
    def __init__(self, server_url: str) -> None:
        self.server_url = normalize_url(server_url)
        self.admin = make_engine(self.server_url, isolation_level="AUTOCOMMIT")
        self.tag = uuid.uuid4().hex[:8]
        self.names: list[str] = []
        self.created = 0

    def create(self) -> str:
        name = f"bench_ingest_{self.tag}_{self.created}"
        self.created += 1
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        self.names.append(name)
        url = make_url(self.server_url).set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        return url

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in self.names:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self.names.clear()
        self.admin.dispose()


def produce(bootstrap: str, topic: str, values: list[tuple[bytes, bytes]]) -> float:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1024 * 1024,
            "message.max.bytes": 16 * 1024 * 1024,
            "queue.buffering.max.kbytes": 1024 * 1024,
        }
    )
    failed: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    start = time.perf_counter()
    for k, v in values:
        while True:
            try:
                producer.produce(topic, key=k, value=v, on_delivery=delivered)
                break
            except BufferError:  # librdkafka's queue is full: let it send
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(600)
    elapsed = time.perf_counter() - start
    if left or failed:
        raise SystemExit(f"producing the records failed: {left} unsent, {failed[:3]}")
    return elapsed


class _Timeline:
    """Where one worker's wall time goes (``--timeline``): its processor thread's time in the
    consumer's poll (apart: polls while paused or holding messages the steps refused), in
    waiting for a writer (``wait_for_writer``), and the rest of each step (decode, batching,
    the commit step); its writes' time (the store write, the dead letters) and how long no
    write was running at all. Installed by wrapping the objects' methods."""

    def __init__(self, processor: Any, consumer: Any) -> None:
        self.t0 = time.perf_counter()
        self.secs: dict[str, float] = {}
        self.writes: list[tuple[float, float]] = []
        self.counts: dict[str, int] = {}
        self.polls: list[tuple[float, int]] = []
        self.processor = processor
        self.inline = processor.steps.next_step.next_step.max_inflight == 1
        write = processor.steps.next_step.next_step  # Decode -> Accumulate -> WriteBatch
        commit = write.next_step
        self._wrap(consumer, "poll", self._poll_label)
        self._wrap(commit.consumer, "commit", lambda: "commit offsets (processor thread)")
        self._wrap(processor, "step", lambda: "step (all)")
        self._wrap(processor, "wait_for_writer", lambda: "wait for a writer")
        self._wrap(write.sink, "write_exchanges", lambda: "store write (writer)", spans=True)
        self._wrap(write.dead_letters, "send", lambda: "dead letters (writer)")

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.secs.clear()
        self.counts.clear()
        self.writes.clear()
        self.polls.clear()

    def _poll_label(self) -> str:
        held = bool(self.processor.held)
        return "poll, paused or holding" if held or self.processor.paused else "poll"

    def _wrap(self, obj: Any, name: str, label: Callable[[], str], spans: bool = False) -> None:
        fn = getattr(obj, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            key = label()
            t = time.perf_counter()
            result: Any = ()
            try:
                result = fn(*args, **kwargs)
                return result
            finally:
                end = time.perf_counter()
                self.secs[key] = self.secs.get(key, 0.0) + end - t
                self.counts[key] = self.counts.get(key, 0) + 1
                if spans:
                    self.writes.append((t, end))
                if name == "poll":
                    self.polls.append((end - t, len(result)))

        setattr(obj, name, timed)

    def summary(self, index: int) -> str:
        wall = time.perf_counter() - self.t0
        busy, last = 0.0, self.t0  # the union of the writes' spans within the window
        for start, end in sorted(self.writes):
            if end > last:
                busy += end - max(start, last)
                last = end
        secs = dict(self.secs)
        step = secs.pop("step (all)", 0.0)
        inside = sum(v for k, v in secs.items() if self.inline or "writer" not in k)
        lines = [f"worker {index}: {wall:.2f}s wall, measured window and the shutdown's start"]
        lines.append(f"  processor thread in step(): {step:.2f}s; outside: {wall - step:.2f}s")
        for key, value in sorted(secs.items()):
            lines.append(f"  {key}: {value:.2f}s in {self.counts[key]} calls")
        lines.append(f"  the rest of step() (decode, batching): {step - inside:.2f}s")
        slow = [(s, m) for s, m in self.polls if s > 0.02]
        lines.append(
            f"  polls over 20 ms: {len(slow)}, {sum(s for s, _ in slow):.2f}s, messages"
            f" {[m for _, m in slow]}"
        )
        lines.append(
            f"  writes: {len(self.writes)}, at least one running {busy:.2f}s,"
            f" none running {wall - busy:.2f}s"
        )
        return "\n".join(lines)


def _worker(
    settings: IngestSettings,
    index: int,
    partitions: int,
    committed: Any,
    assigned: Any,
    stop: Any,
    gc_tuning: bool,
    profile: bool,
    timeline: bool = False,
    backpressure: str = "wait",
    dry: Any = None,
    measuring: Any = None,
) -> None:
    """One ingester process, as `shadow-ab ingest` runs it: consume until ``stop`` is set.
    Publishes its committed offsets (per partition of the exchanges topic), how many
    partitions of that topic it has now (``assigned[index]``) and when it first found its
    partitions read to their ends (``dry[index]``)."""
    engine = make_engine(settings.database_url)
    consumer = make_consumer(settings)
    if dry is not None:
        poll = consumer.poll

        taken: dict[Any, int] = {}  # partition -> the next offset to take

        def watched(timeout_ms: int, max_records: int | None = None) -> Any:
            got = poll(timeout_ms, max_records)
            for m in got:
                taken[Partition(m.topic, m.partition)] = m.offset + 1
            if max_records is not None and not got and not dry[index] and measuring.is_set():
                mine = [
                    tp
                    for tp in consumer.assignment()
                    if tp.topic == settings.ingest_topic_exchanges
                ]
                highs = [consumer.highwater(tp) for tp in mine]
                if mine and all(
                    h is not None and taken.get(tp, 0) >= h
                    for tp, h in zip(mine, highs, strict=True)
                ):  # every partition read to its end (an empty poll alone may be a slow fetch)
                    dry[index] = time.perf_counter()  # CLOCK_MONOTONIC: every process's
            return got

        consumer.poll = watched  # type: ignore[method-assign]
    producer = make_producer(settings)
    processor = build_processor(settings, consumer, producer, engine)
    if backpressure == "pause":  # as before: pause the partitions as soon as the steps push back
        processor.wait_for_writer = lambda: False  # type: ignore[method-assign]
    if gc_tuning:
        tune_gc()
    profiler = cProfile.Profile() if profile else None
    clock = _Timeline(processor, consumer) if timeline else None
    started = False
    try:
        processor.subscribe()
        if profiler:
            profiler.enable()
        while not stop.is_set():
            if clock and not started and measuring.is_set():
                clock.reset()  # the measured window only: every worker holds partitions
                started = True
            processor.step()
            assigned[index] = sum(
                1 for tp in consumer.assignment() if tp.topic == settings.ingest_topic_exchanges
            )
            for tp, off in processor.committed_offsets.items():
                if tp.topic == settings.ingest_topic_exchanges and tp.partition < partitions:
                    committed[tp.partition] = max(committed[tp.partition], off)
        if profiler:
            profiler.disable()
        if clock:
            print(clock.summary(index), flush=True)
        assert processor.shutdown(30)
    finally:
        consumer.close()
        producer.close(timeout=10)
        engine.dispose()
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())


def _proc_cpu(pid: int) -> tuple[str, float] | None:
    """(command name, CPU seconds used so far) of a process, from /proc (Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return comm, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_by_process(workers: set[int], backends: set[int] = frozenset()) -> dict[str, float]:
    """CPU seconds used so far by the ingester workers, PostgreSQL (and apart, the server
    backends ``backends``), Kafka (java) and the rest of the machine, from /proc (Linux); plus
    "idle" from /proc/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"ingester": 0.0, "postgres": 0.0, "pg db": 0.0, "kafka": 0.0, "other": 0.0}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        found = _proc_cpu(pid)
        if found is None:
            continue
        comm, used = found
        group = (
            "ingester"
            if pid in workers
            else "postgres"
            if comm.startswith("postgres")
            else "kafka"
            if comm == "java"
            else "other"
        )
        out[group] += used
        if pid in backends:
            out["pg db"] += used
    with open("/proc/stat") as f:
        cpu = f.readline().split()
    out["idle"] = (int(cpu[4]) + int(cpu[5])) / tick
    return out


def _backends(engine: Any) -> set[int]:
    """Process ids of the PostgreSQL backends connected to ``engine``'s database, but its own."""
    with engine.connect() as conn:
        pids = conn.execute(
            text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        ).scalars()
        return {int(p) for p in pids}


def _load() -> float:
    return os.getloadavg()[0]


LAST_CPU: dict[str, float] = {}
"""CPU seconds per record of the last measured run, by process group (see _cpu_by_process)."""
LAST_LOAD: list[float] = []
LAST_TO_END: list[float] = []
"""Records committed from the start to the last one, and the seconds that took."""
"""The 1-minute load averages sampled during the last measured run."""


def ingest_once(
    settings: IngestSettings,
    n: int,
    workers: int,
    gc_tuning: bool = True,
    profile: bool = False,
    timeline: bool = False,
    backpressure: str = "wait",
) -> tuple[float, int, float]:
    """Run ``workers`` ingester processes in one consumer group until all ``n`` records are
    committed. Returns (startup seconds, records measured, seconds): the measurement starts
    once every worker holds partitions (the group is stable: no more rebalances) and ends when
    the first worker has read its partitions to their ends, counting the records
    committed in between: the steady rate with every worker busy. Workers do not run out
    together (the first to join reads all partitions alone until the others join), and the
    last batch of each waits out the batch timeout, so the time to the last record (in
    ``LAST_TO_END``) holds idle time that is the bench's, not the ingester's."""
    ctx = mp.get_context("spawn")
    committed = ctx.Array("q", PARTITIONS, lock=False)
    assigned = ctx.Array("q", workers, lock=False)
    dry = ctx.Array("d", workers, lock=False)
    stop = ctx.Event()
    measuring = ctx.Event()
    t0 = time.perf_counter()
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                settings,
                i,
                PARTITIONS,
                committed,
                assigned,
                stop,
                gc_tuning,
                profile,
                timeline,
                backpressure,
                dry,
                measuring,
            ),
            daemon=True,
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    start: tuple[float, int] | None = None
    busy_end: tuple[float, int] | None = None
    watch = make_engine(settings.database_url)  # one connection, left out of "pg db"
    loads: list[float] = []
    next_load = 0.0
    pids: set[int] = set()
    backends: set[int] = set()
    try:
        while True:
            done = sum(committed)
            if start is None and all(assigned) and sum(assigned) == PARTITIONS:
                start = (time.perf_counter(), done)
                measuring.set()
                pids = {p.pid for p in procs if p.pid is not None}
                # Backends that exist now; those the writers open later are added as found
                # (their CPU before the start is theirs to count: they did not exist).
                backends = _backends(watch)
                cpu0 = _cpu_by_process(pids, backends)
            now = time.perf_counter()
            if start is not None and now >= next_load:
                loads.append(_load())
                # A backend opened since the start used all its CPU within the window.
                backends |= _backends(watch)
                next_load = now + 1.0
            if start is not None and busy_end is None and any(d > start[0] for d in dry):
                # A worker ran out of records (its partitions are read): the others work on
                # alone, so the steady rate of every worker busy ends here.
                busy_end = (time.perf_counter(), done)
                cpu_busy = _cpu_by_process(pids, backends)
                loads.append(_load())
            if done >= n:
                break
            time.sleep(0.002)
            if time.perf_counter() - t0 > 900 or not all(p.is_alive() for p in procs):
                raise SystemExit(f"gave up: {done} of {n} committed")
        end = time.perf_counter()
        if busy_end is None:  # every worker ran dry at once (or no poll came back empty)
            busy_end = (end, n)
            cpu_busy = _cpu_by_process(pids, backends)
            loads.append(_load())
    finally:
        stop.set()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    with watch.connect() as conn:
        rows = conn.execute(text("SELECT count(*) FROM exchanges")).scalar_one()
    watch.dispose()
    if rows != n:
        raise SystemExit(f"expected {n} rows, found {rows}")
    assert start is not None
    busy = busy_end[1] - start[1]
    LAST_CPU.clear()
    LAST_CPU.update({k: (cpu_busy[k] - cpu0[k]) / max(busy, 1) for k in cpu_busy})
    LAST_LOAD[:] = loads
    LAST_TO_END[:] = [n - start[1], end - start[0]]
    return start[0] - t0, busy, busy_end[0] - start[0]


# -- parts, each alone -------------------------------------------------------------------------


def _fetch_consumer(bootstrap: str, topic: str, fetch_kb: int) -> Any:
    """The ingester's adapter (ingester.clients) over a group-less consumer assigned every
    partition of ``topic`` from the start: the fetch alone, no group join."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from ingester.confluent_client import ConfluentConsumer

    raw = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-fetch-{uuid.uuid4().hex[:8]}",  # never joined
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": fetch_kb * 1024,
            "fetch.max.bytes": 64 * 1024 * 1024,
        }
    )
    raw.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    return ConfluentConsumer(raw, bootstrap)


def time_consume_only(
    bootstrap: str, topic: str, n: int, fetch_kb: int = 8192
) -> tuple[float, float]:
    """(wall, CPU) seconds to fetch ``n`` records through the ingester's adapter; the CPU is
    the whole process's (every thread: librdkafka's too)."""
    consumer = _fetch_consumer(bootstrap, topic, fetch_kb)
    got = 0
    first, cpu = time.perf_counter(), time.process_time()
    while got < n:
        got += len(consumer.poll(timeout_ms=200, max_records=5000))
    elapsed, cpu = time.perf_counter() - first, time.process_time() - cpu
    consumer.close()
    return elapsed, cpu


def time_poll_with_pauses(
    bootstrap: str, topic: str, n: int, pause: bool, work_s: float = 0.05
) -> float:
    """Seconds a record spent in the consumer's poll, polls of 1,000 with ``work_s`` of other
    work (a sleep: the batch's decoding) between them, and with ``pause``: every partition
    paused and resumed after each poll, as the ingester's back-pressure did while its writers
    were busy (librdkafka drops the prefetched messages of a paused partition, and fetches
    them again after the resume)."""
    consumer = _fetch_consumer(bootstrap, topic, 8192)
    got, polling = 0, 0.0
    while got < n:
        t = time.perf_counter()
        got += len(consumer.poll(timeout_ms=500, max_records=1000))
        polling += time.perf_counter() - t
        if pause:
            assigned = consumer.assignment() or {Partition(topic, p) for p in range(PARTITIONS)}
            consumer.pause(*assigned)
        time.sleep(work_s)
        if pause:
            consumer.resume(*consumer.paused())
    consumer.close()
    return polling / got


def time_batching(row: Any, offer_every_message: bool, rounds: int = 7) -> float:
    """Seconds a message costs Accumulate + WriteBatch (batches of 1,000, 2 in flight) while
    the writer is full and a complete batch waits for it: the writes never finish (a runner
    that only holds them), the store is a no-op. ``offer_every_message``: as before, every
    message offers the waiting batch to the writer (a check, a gauge update and a raised
    MessageRejected each). Best of ``rounds``."""
    from concurrent.futures import Future

    from ingester.backoff import Backoff
    from ingester.batch import Decoded
    from ingester.clock import SystemClock
    from ingester.sink import StoreSink
    from ingester.steps import Accumulate, CommitOffsets, WriteBatch

    class Held:
        def submit(self, fn: Any) -> Future[None]:
            return Future()

    class Message:
        __slots__ = ("key", "offset", "partition", "topic", "value")

        def __init__(self, offset: int) -> None:
            self.topic, self.partition, self.offset, self.key, self.value = "t", 0, offset, b"", b""

    class Before(WriteBatch):
        """As before: every message offers the writer the waiting batch, and every check sets
        the paused gauge."""

        _paused_shown = property(lambda self: True, lambda self, value: None)  # type: ignore[assignment]

        def has_room(self) -> bool:
            return True

    best = float("inf")
    for _ in range(rounds):
        clock = SystemClock()
        sink = StoreSink(None, lambda e, r: len(r), lambda e, r: len(r))  # type: ignore[arg-type]
        write = (Before if offer_every_message else WriteBatch)(
            sink,
            type("NoLetters", (), {"send": lambda self, letters: None})(),
            CommitOffsets(None, clock=clock),  # type: ignore[arg-type]
            clock,
            Backoff(initial_s=1.0, cap_s=8.0, rng=random.Random(1)),
            Held(),
            2,
        )
        acc = Accumulate(write, clock, max_size=1000, max_wait_s=600)
        items = [Decoded(Message(i), row) for i in range(3999)]
        for item in items[:3000]:  # two batches in flight, the third waiting
            acc.submit(item)
        t = time.perf_counter()
        for item in items[3000:]:
            acc.submit(item)
        best = min(best, (time.perf_counter() - t) / 999)
    return best


def _write_all(engine: Any, chunks: list[list[Any]]) -> None:
    for chunk in chunks:
        write_exchanges(engine, chunk)


def cpu_per_record(fn: Callable[[], None], n: int, rounds: int = 3) -> tuple[float, float]:
    """(wall, this process's CPU) seconds per record of ``fn`` over ``n`` records, the best of
    ``rounds`` rounds: on a shared machine the CPU time moves far less with load."""
    best = (float("inf"), float("inf"))
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        best = min(best, ((time.perf_counter() - wall) / n, (time.process_time() - cpu) / n))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--batch-sizes", default="100,1000,5000")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print where each worker's wall time went (poll, wait, decode, writes)",
    )
    parser.add_argument(
        "--workers", default="1,2", help="ingester processes in one consumer group, e.g. 1,2"
    )
    parser.add_argument(
        "--gc",
        default="tuned",
        help="tuned (as `shadow-ab ingest` runs: ingester.app.tune_gc), default, or both",
    )
    parser.add_argument(
        "--fetch-partition-kb",
        default="8192",
        help="SHADOW_AB_INGEST_FETCH_PARTITION_KB values to compare, e.g. 1024,8192",
    )
    parser.add_argument(
        "--decoder",
        default="msgspec,rows",
        help="SHADOW_AB_INGEST_DECODER values, e.g. pydantic,msgspec,rows (the old first)",
    )
    parser.add_argument(
        "--inflight", default="2", help="SHADOW_AB_INGEST_INFLIGHT_BATCHES values, e.g. 1,2,3"
    )
    parser.add_argument(
        "--backpressure",
        default="wait",
        help=(
            "wait (the ingester's: wait for a running write, the consumer keeps its prefetched"
            " messages) or pause (before: pause the partitions at once), e.g. pause,wait"
        ),
    )
    parser.add_argument("--repeat", type=int, default=1, help="run each configuration N times")
    parser.add_argument(
        "--top-logprobs",
        type=int,
        default=0,
        help="the candidate's and the replay's records carry logprobs with this many"
        " alternatives a token, as the mirror asks for them (its default: 5); 0: none",
    )
    parser.add_argument("--parts", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--runs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--no-runs: only the parts (the floors), no ingester runs",
    )
    args = parser.parse_args()
    n = args.records
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    worker_counts = [int(w) for w in args.workers.split(",")]
    gcs = ["tuned", "default"] if args.gc == "both" else [args.gc]
    fetch_kbs = [int(k) for k in args.fetch_partition_kb.split(",")]
    decoders = args.decoder.split(",")
    unknown = [d for d in decoders if d not in DECODERS]
    if unknown:
        raise SystemExit(f"--decoder: unknown {unknown}; choose from {', '.join(DECODERS)}")
    inflights = [int(k) for k in args.inflight.split(",")]
    backpressures = args.backpressure.split(",")
    if set(backpressures) - {"wait", "pause"}:
        raise SystemExit(f"--backpressure: {backpressures}; choose from wait, pause")

    common = CommonSettings()
    bootstrap = common.kafka_bootstrap
    if not bootstrap or not common.database_url.startswith("postgresql"):
        raise SystemExit(
            "no Kafka/PostgreSQL configured: run `shadow-ab services up` and"
            ' `eval "$(shadow-ab services env)"` first'
        )

    tag = uuid.uuid4().hex[:8]
    topic, health, dlq = f"bench-{tag}.exchanges", f"bench-{tag}.health", f"bench-{tag}.dlq"
    ensure_topics(bootstrap, [TopicSpec(topic, 6), TopicSpec(health, 3), TopicSpec(dlq, 1)])
    dbs = FreshDatabases(common.database_url)
    try:
        t = time.perf_counter()
        values = make_values(n, deployment=f"bench-{tag}", top_logprobs=args.top_logprobs)
        gen_s = time.perf_counter() - t
        mean_bytes = sum(len(v) for _, v in values) / n
        mean_text = sum(len(r.output_text or "") + len(_prompt(r)) for r in _parsed(values)) / n
        produce_s = produce(bootstrap, topic, values)
        print(
            f"{n} records, mean {mean_bytes:,.0f} bytes of JSON each ({mean_text:,.0f} bytes of"
            f" prompt + output text); generated in {gen_s:.1f}s,"
            f" produced in {produce_s:.1f}s ({n / produce_s:,.0f}/s, acks=all)"
        )
        print()
        print(
            "| batch size | workers | decoder | in flight | back-pressure | gc | fetch KiB"
            " | records measured | startup s | seconds | records/s | vs first"
            " | to the last: records, s, records/s"
            f" | vs {decoders[0]} | ratio to 10,000/s"
            " | CPU us/record: ingester / postgres (pg db) / kafka / other / idle"
            " | load avg mean / max |"
        )
        print("|---:|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|")
        # The decoders innermost: the old and the new one run back to back on each setting.
        runs = [
            (rep, size, workers, decoder, inflight, gc_mode, fetch_kb, bp)
            for rep in range(args.repeat)
            for size in sizes
            for workers in worker_counts
            for inflight in inflights
            for gc_mode in gcs
            for fetch_kb in fetch_kbs
            for bp in backpressures
            for decoder in decoders
        ]
        first_rate: float | None = None
        old_rate: dict[tuple[Any, ...], float] = {}
        for i, (rep, size, workers, decoder, inflight, gc_mode, fetch_kb, bp) in enumerate(
            runs if args.runs else []
        ):
            settings = IngestSettings(
                kafka_bootstrap=bootstrap,
                database_url=dbs.create(),
                ingest_group=f"bench-{tag}-{i}",
                ingest_batch_size=size,
                ingest_batch_timeout_ms=1000,
                ingest_topic_exchanges=topic,
                ingest_topic_health=health,
                ingest_topic_dlq=dlq,
                ingest_create_topics=False,
                ingest_kafka_consumer={"max.partition.fetch.bytes": fetch_kb * 1024},
                ingest_decoder=decoder,
                ingest_inflight_batches=inflight,
            )
            startup, measured, seconds = ingest_once(
                settings,
                n,
                workers,
                gc_tuning=gc_mode == "tuned",
                profile=args.profile and size == 1000,
                timeline=args.timeline,
                backpressure=bp,
            )
            dbs.drop_all()
            rate = measured / seconds
            first_rate = first_rate or rate
            setting = (rep, size, workers, inflight, gc_mode, fetch_kb, bp)
            old = old_rate.setdefault(setting, rate)  # the first decoder's, on this setting
            us = {k: f"{LAST_CPU[k] * 1e6:.0f}" for k in CPU_GROUPS}
            last_n, last_s = LAST_TO_END
            print(
                f"| {size:,} | {workers} | {decoder} | {inflight} | {bp} | {gc_mode}"
                f" | {fetch_kb:,} | {measured:,} | {startup:.2f} | {seconds:.2f} | {rate:,.0f}"
                f" | {rate / first_rate:.2f}"
                f" | {last_n:,.0f}, {last_s:.2f}, {last_n / last_s:,.0f}"
                f" | {rate / old:.2f} | {rate / GOAL:.2f}"
                f" | {us['ingester']} / {us['postgres']} ({us['pg db']}) / {us['kafka']}"
                f" / {us['other']} / {us['idle']}"
                f" | {sum(LAST_LOAD) / len(LAST_LOAD):.1f} / {max(LAST_LOAD):.1f} |",
                flush=True,
            )
        if not args.parts:
            return

        # Where the time goes: each part alone, on the same records, microseconds per record.
        print()
        load0 = _load()
        consume = []
        for kb in fetch_kbs:
            wall, cpu = time_consume_only(bootstrap, topic, n, kb)
            consume.append((kb, (wall / n, cpu / n)))
        polls = [
            (pause, time_poll_with_pauses(bootstrap, topic, min(n, 20_000), pause))
            for pause in (True, False)
        ]
        if "tuned" in gcs:
            tune_gc()  # as the ingester runs
        decodes: list[tuple[str, tuple[float, float]]] = []
        outputs: dict[str, list[Any]] = {}
        for name in DECODERS:
            # msgspec's records feed the rows and write parts below: always measured
            if name not in decoders and name != "msgspec":
                continue
            decoded: list[Any] = []

            def run(name: str = name, out: list[Any] = decoded) -> None:
                fast, rows = name != "pydantic", name == "rows"
                out[:] = [decode(v, "exchange", fast=fast, rows=rows) for _, v in values]

            decodes.append((name, cpu_per_record(run, n)))
            outputs[name] = decoded
            kind = ExchangeRow if name == "rows" else ExchangeRecord
            assert sum(isinstance(r, kind) for r in decoded) == n
        records = outputs["msgspec"]
        row = outputs.get("rows", records)[0]
        batching = {offer: time_batching(row, offer) for offer in (True, False)}
        rows_us = cpu_per_record(lambda: [exchange_values(r, WIRE) for r in records], n)
        url = dbs.create()
        engine = make_engine(url)
        write_exchanges(engine, records[:1])  # the connection and partitions: not the write
        writes: dict[str, tuple[tuple[float, float], float]] = {}
        for name in ("records", "rows") if "rows" in outputs else ("records",):
            items = outputs["msgspec" if name == "records" else "rows"]
            chunks = [items[i : i + 1000] for i in range(0, n, 1000)]
            with engine.begin() as conn:
                conn.execute(text("TRUNCATE exchanges"))
                backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            pg0 = (_proc_cpu(backend) or ("", 0.0))[1]
            wall = time.perf_counter()
            cpu = time.process_time()
            _write_all(engine, chunks)
            write_us = ((time.perf_counter() - wall) / n, (time.process_time() - cpu) / n)
            pg_us = ((_proc_cpu(backend) or ("", 0.0))[1] - pg0) / n
            writes[name] = (write_us, pg_us)
        with engine.connect() as conn:  # what the last write left: every record, once
            stored = conn.execute(
                text(
                    "SELECT sum(pg_total_relation_size(inhrelid)), sum(pg_relation_size(inhrelid))"
                    " FROM pg_inherits WHERE inhparent = 'exchanges'::regclass"
                )
            ).one()
        engine.dispose()
        write_us, pg_us = writes["records"]
        parts = [
            *((f"fetch: {kb:,} KiB a partition (consumer poll only)", s) for kb, s in consume),
            *(
                (
                    "decode + validate + rows (rows: msgspec straight to the row values)"
                    if name == "rows"
                    else f"decode + validate ({name})",
                    s,
                )
                for name, s in decodes
            ),
            ("rows: exchange_values, binary wire values (part of the store write)", rows_us),
            (
                "copy: the store write less its rows (dedupe, sort, COPY, commit; client side)",
                (write_us[0] - rows_us[0], write_us[1] - rows_us[1]),
            ),
            ("store write of records, batches of 1,000 (rows + copy)", write_us),
            ("postgres: the server backend's CPU for the store write", (pg_us, pg_us)),
        ]
        if "rows" in writes:
            parts += [
                ("store write of the rows decoder's rows (copy only)", writes["rows"][0]),
                ("postgres: the backend's CPU for that write", (writes["rows"][1],) * 2),
            ]
        for pause, per_record in polls:
            print(
                f"poll wall, polls of 1,000 with 50 ms of work between them,"
                f" {'a pause and resume after each' if pause else 'no pause'}:"
                f" {per_record * 1e6:,.0f} us a record ({per_record * 1e3 * 1000:,.0f} ms a poll)"
            )
        print(
            "batching (Accumulate + WriteBatch) while the writer is full, a message:"
            f" {batching[True] * 1e6:.2f} us offering it the waiting batch each time (before),"
            f" {batching[False] * 1e6:.2f} us now ({batching[False] / batching[True]:.2f}x)"
        )
        print()
        print(
            "| part (alone, same records) | wall us/record | CPU us/record"
            " | records/s a core gives it (by CPU) |"
        )
        print("|---|---:|---:|---:|")
        for name, (wall_s, cpu_s) in parts:
            rate = 1 / max(cpu_s, 1e-9)
            print(f"| {name} | {wall_s * 1e6:,.0f} | {cpu_s * 1e6:,.0f} | {rate:,.0f} |")
        totals: dict[str, float] = {}
        for kb, (_, fetch_cpu) in consume:
            for name, (_, cpu_s) in decodes:
                if name not in decoders:
                    continue
                (_, write_cpu), pg = writes["rows" if name == "rows" else "records"]
                total = fetch_cpu + cpu_s + write_cpu
                totals[f"{kb:,} KiB, {name}"] = total
                print(
                    f"| ingester CPU ({kb:,} KiB) + {name}: fetch + decode + rows +"
                    f" copy (PostgreSQL's own CPU not included) | | {total * 1e6:,.0f}"
                    f" | {1 / total:,.0f} |"
                )
                both = total + pg
                print(
                    f"| the same + postgres: what 2 cores give ({kb:,} KiB, {name})"
                    f" | | {both * 1e6:,.0f} | {2 / both:,.0f} for 2 cores |"
                )
        decode_cpu = {name: s[1] for name, s in decodes}
        if "pydantic" in decode_cpu:
            print(
                "| decode CPU, pydantic over msgspec | |"
                f" {decode_cpu['pydantic'] / decode_cpu['msgspec']:.2f}x | |"
            )
        if "rows" in decode_cpu:
            old = decode_cpu["msgspec"] + writes["records"][0][1]
            new = decode_cpu["rows"] + writes["rows"][0][1]
            print(
                "| decode + store write CPU (client side), rows over msgspec | |"
                f" {new / old:.2f}x ({new * 1e6:,.0f} against {old * 1e6:,.0f}) | |"
            )
        print(
            f"\nPostgreSQL bytes a row of these records: {stored[0] / n:,.0f} in all (table,"
            f" TOAST, indexes), {stored[1] / n:,.0f} of them in the table's own pages"
        )
        print(
            f"load average (1 min) over the parts: {load0:.1f} at the start,"
            f" {_load():.1f} at the end"
        )
    finally:
        dbs.drop_all()
        delete_topics(bootstrap, [topic, health, dlq])


if __name__ == "__main__":
    main()
