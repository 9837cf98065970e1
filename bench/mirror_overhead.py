"""What shadow-ab's mirror adds to the client's path, next to going direct and next to nginx.

    python bench/mirror_overhead.py [--duration 24 | --requests N] [--concurrency 4,32]
        [--repeat 3] [--max-tokens 32] [--quick] [--database-url URL] [--json PATH]
        [--paths direct,nginx,nginx-mirror,mirror] [--no-install-nginx]
        [--kafka HOST:PORT]

Engines (``shadow-ab sim`` subprocesses, real HTTP on 127.0.0.1):

- incumbent: vLLM flavor at DESIGN's reference speed, ~40 ms TTFT (prefill 30 ms + one 8 ms
  decode step) then 8 ms a token, short answers (16-24 tokens, ``max_tokens`` 32);
- candidate: TensorRT-LLM flavor, the same prefill, decode 20% faster;
- slow candidate: TensorRT-LLM flavor, 10x slower (prefill 300 ms, decode 80 ms a token).

Paths, side by side in one run, each with its own keep-alive client session:

- ``direct``: client -> incumbent;
- ``mirror``: client -> ``shadow-ab mirror`` -> incumbent, shadowing every request (sample rate
  1.0, guard off so nothing is backed off, shadow cap 512) to the candidate, capture ``full``
  and the candidate asked for ``shadow.top_logprobs`` as configured by default; records to the
  direct sink on a temporary SQLite file (or ``--database-url``);
- ``mirror-slow``: the same with the 10x slower candidate;
- ``mirror-off``: the same mirror with shadow rate 0 (the serving path's own cost, for scale);
- ``mirror-x2``: ``mirror`` with ``workers: 2``, two mirror processes on one port (the kernel
  spreads the connections, mirror/workers.py), one per core; CPU and shadowed counts are summed
  over both;
- ``mirror-lean``: ``mirror`` with the candidate asked for no logprobs (``shadow.top_logprobs:
  null``) and records keeping no text (``privacy.capture: metadata``): the work of the logprob
  asks and of capture ``full`` left out;
- ``mirror-shed``: ``mirror`` with the mirror's overload shedding on (``overload.enabled``, its
  default lags: mirror/overload.py): shadowing scales down while the mirror's loop lags, and
  the ``shadowed`` column says how much was still shadowed;
- ``nginx``: a private Debian nginx (own prefix and config in a temp dir, free ports, one
  worker, ``proxy_buffering off``, upstream keep-alive) with ``proxy_pass`` only;
- ``nginx-mirror``: the same plus nginx's ``mirror`` directive to the candidate (healthy);
- ``nginx-mirror-slow``: the same to the 10x slower candidate;
- ``floor``: ``bench/tee_floor.py``, the least a Python mirror on the mirror's runtime
  (``uvloop``, ``httptools``) can do per request: nginx ``mirror``'s two legs (the
  incumbent's answer relayed, the candidate's read and dropped), no parsing, no records. What
  it spends above nginx ``mirror`` is the runtime's price for the same legs; what the mirror
  spends above it is the work the mirror adds;
- ``floor-record``: the same floor also doing the least of the mission's work (both answers
  timed per chunk and parsed into TTFT, gaps, text and usage; one record per side encoded by a
  thread and appended to a file): what the mirror spends above it is its implementation's.

Default: ``direct,nginx,nginx-mirror,mirror`` at concurrency 4 and 32, what the goals need.

Goals (issue 26, "Performance goals, restated"), printed at the end from the run's own figures,
each MET, NOT MET by how much, or NOT MEASURED (with the ``--paths``/``--concurrency`` that
would measure it):

1. the mirror's own added time before the first byte (``shadow_ab_mirror_added_seconds`` from
   its admin /metrics, path ``mirror``) p50 <= 1 ms and p99 <= 5 ms at 32 streams;
2. at 4 streams, the mirror's client-side added TTFT p50 within 1 ms of nginx ``proxy_pass``'s;
3. at 32 streams, the mirror's client-side added TTFT p50 and p99 no more than nginx
   ``mirror``'s with a healthy candidate (and ``mirror-slow``'s no more than
   ``nginx-mirror-slow``'s, when both ran);
4. at 32 streams, the mirror's CPU per shadowed request at most 2x nginx ``mirror``'s (healthy
   candidate). The floor paths, when they ran, get lines 3 and 4 too, for reference.

With ``--kafka``, records go to the production Kafka sink (topics of the run).

nginx is installed with ``apt-get install -y nginx-light`` when absent (the bench says so
first; when it cannot be installed, or with ``--no-install-nginx``, the nginx paths are left
out and the output says NGINX MISSING); it
runs as its own master process with ``daemon off`` and never reads /etc/nginx's sites.

Traffic (``shadow_ab.dev.traffic``, uniform mode): one fixed streaming greedy chat request shape,
closed loop at each concurrency; TTFT (first SSE event with non-empty ``choices``) and E2E (last
such event) measured by the client on a monotonic clock. Interleaved rounds (``--repeat``):
each round drives every path once at a concurrency level, one after another in an order
shuffled per round (``random.Random(--seed)``; the orders are printed), each segment after a
warm-up on its own session (discarded) and after the candidates went idle. Every figure is the
median over rounds of the round's own: a percentile of the segment (``--duration`` / rounds
long), the added latency as the path's percentile minus direct's in the same round ([min, max]
over rounds beside the added TTFT), ``proxy CPU ms/req`` as user + system CPU of the proxy's
process tree (from /proc/<pid>/stat) over the segment divided by the requests answered (the
mirror's includes reading the candidate's stream and writing records). ``shadowed`` is the
share of requests the mirror sent to the candidate (from its /metrics). ``loop lag p99`` is the
mirror's own queueing (``shadow_ab_mirror_loop_lag_seconds``, mirror/overload.py): the bucket
bound under which 99 % of its 50 ms timer's ticks fired late during the measured segments,
summed over its workers. ``own added p50 / p99`` is the mirror's own account of what it added
before the client's first byte (``shadow_ab_mirror_added_seconds``: the time from reading the
request to asking the incumbent, plus from reading the first chunk to writing it), as bucket
bounds; it leaves out what the client's clock sees and the mirror cannot (the kernel's queues,
the process waiting for a core), and it has no figure for nginx. These three are over all the
rounds' segments together.

The machine has 2 cores: the client (this process), three simulators, the mirror and nginx
share them, along with whatever else runs (the output prints the load average before and
after). Figures are the overhead on a loaded 2-core box, not on a dedicated proxy host; on a
box shared with other work, ``nice -n -10 python bench/mirror_overhead.py`` (as root) gives the
client, simulators, mirror and nginx priority over it (children inherit the niceness).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from shadow_ab.dev.processes import (
    ManagedProcess,
    ProcessError,
    RunningSim,
    free_port,
    http_get,
    running_sim,
)
from shadow_ab.dev.processes import running_mirror as dev_running_mirror
from shadow_ab.dev.traffic import (
    RequestRow,
    TrafficMix,
    TrafficResult,
    make_plan,
    make_session,
    run_traffic,
)
from shadow_ab.topics import TopicSpec, delete_topics, ensure_topics

GOAL_LOW_CONCURRENCY = 4
GOAL_CONCURRENCY = 32
GOAL_OWN_P50_S = 0.001
"""The mirror's own added time before the first byte, p50, at 32 streams (issue 26)."""
GOAL_OWN_P99_S = 0.005
"""... and its p99."""
GOAL_VS_NGINX_P50_S = 0.001
"""At 4 streams, client-side added TTFT p50 over nginx proxy_pass's at most this."""
GOAL_CPU_RATIO = 2.0
"""At 32 streams, CPU per shadowed request at most this times nginx `mirror`'s."""

ANSWERS = {"min_tokens": 16, "max_tokens": 24}
INCUMBENT = {
    "latency": {"prefill_base_ms": 30.0, "decode_ms": 8.0, "noise": 0.05},
    "answers": ANSWERS,
}
CANDIDATE = {
    "latency": {"prefill_base_ms": 30.0, "decode_ms": 6.4, "noise": 0.05},
    "answers": ANSWERS,
}
SLOW_CANDIDATE = {
    "latency": {"prefill_base_ms": 300.0, "decode_ms": 80.0, "noise": 0.05},
    "answers": ANSWERS,
}

PATHS = (
    "direct",
    "nginx",
    "nginx-mirror",
    "nginx-mirror-slow",
    "floor",
    "floor-record",
    "mirror-off",
    "mirror",
    "mirror-slow",
    "mirror-shed",
    "mirror-x2",
    "mirror-lean",
)
DEFAULT_PATHS = ("direct", "nginx", "nginx-mirror", "mirror")
NGINX_PATHS = ("nginx", "nginx-mirror", "nginx-mirror-slow")


@dataclass(frozen=True)
class MirrorPath:
    """How a mirror path's ``shadow-ab mirror`` runs."""

    rate: float
    """The shadow rate."""
    slow: bool = False
    """The candidate is the 10x slower simulator."""
    shed: bool = False
    """``overload.enabled`` (its default lags)."""
    workers: int = 1
    """Mirror processes on the port (``workers``)."""
    lean: bool = False
    """The candidate asked for no logprobs (``shadow.top_logprobs: null``) and records keep no
    text (``privacy.capture: metadata``)."""


MIRRORS = {
    "mirror-off": MirrorPath(0.0),
    "mirror": MirrorPath(1.0),
    "mirror-slow": MirrorPath(1.0, slow=True),
    "mirror-shed": MirrorPath(1.0, shed=True),
    "mirror-x2": MirrorPath(1.0, workers=2),
    "mirror-lean": MirrorPath(1.0, lean=True),
}
MIRROR_PATHS = tuple(MIRRORS)
FLOORS = ("floor", "floor-record")
LABELS = {
    "direct": "direct",
    "mirror-off": "mirror, shadowing off",
    "mirror": "mirror, candidate",
    "mirror-slow": "mirror, 10x slow candidate",
    "mirror-shed": "mirror, candidate, overload shedding on",
    "mirror-x2": "mirror, candidate, 2 processes on one port",
    "mirror-lean": "mirror, candidate, no logprob asks, capture metadata",
    "nginx": "nginx proxy_pass",
    "nginx-mirror": "nginx `mirror`, candidate healthy",
    "nginx-mirror-slow": "nginx `mirror`, 10x slow candidate",
    "floor": "Python tee floor (bench/tee_floor.py)",
    "floor-record": "Python tee floor with records (tee_floor.py --record)",
}


class BenchError(ProcessError):
    """A piece of the benchmark did not start."""


# -- processes and their CPU -----------------------------------------------------------------


def _tree(pid: int) -> Iterator[int]:
    """A process and its live descendants."""
    todo = [pid]
    while todo:
        p = todo.pop()
        yield p
        todo += _children(p)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    return out


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Every thread of a process and of its live descendants onto ``cpus``."""
    for p in _tree(pid):
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task), cpus)


def pids_running(needle: bytes) -> list[int]:
    """Processes whose command line holds ``needle``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
    return found


@contextlib.contextmanager
def pinned_apart(proxy_cpu: int, other_cpu: int) -> Iterator[Callable[[int], None]]:
    """This process (so the simulators it starts) and the Kafka broker on ``other_cpu``; the
    function it yields puts a proxy's process tree on ``proxy_cpu``. Affinities are restored
    after."""
    everything = os.sched_getaffinity(0)
    brokers = pids_running(b"kafka.Kafka")
    pin_tree(os.getpid(), {other_cpu})
    for pid in brokers:
        pin_tree(pid, {other_cpu})
    try:
        yield lambda pid: pin_tree(pid, {proxy_cpu})
    finally:
        for pid in [os.getpid(), *brokers]:
            pin_tree(pid, everything)


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants, from /proc."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                rest = f.read().rsplit(")", 1)[1]
        except OSError:
            continue
        fields = rest.split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return float(sum(vals) - idle), float(sum(vals))


def answers(url: str) -> bool:
    """Whether ``url`` answers 200."""
    return http_get(url, timeout=1.0)[0] == 200


class Nginx(ManagedProcess):
    """The private nginx (master + one worker); its startup errors go to its error log."""

    name = "nginx"
    error = BenchError
    stop_timeout = 30.0

    def __init__(self, cmd: list[str], prefix: Path) -> None:
        super().__init__(cmd, prefix / "stderr.log", merge_stdout=True)
        self.error_log = prefix / "error.log"

    def stderr(self) -> str:
        try:
            return self.error_log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


# -- shadow-ab mirror ------------------------------------------------------------------------


@dataclass
class Proxy:
    """One proxy path under test: where the client sends, whose CPU counts."""

    base_url: str
    pid: int
    metrics_url: str | None = None
    more_metrics: list[str] = field(default_factory=list)
    """The other workers' metrics (``workers`` above 1); their CPU is in ``pid``'s tree."""


@contextlib.contextmanager
def running_mirror(
    incumbent: str,
    candidate: str,
    workdir: Path,
    database_url: str | None,
    name: str,
    rate: float = 1.0,
    kafka: str | None = None,
    shed: bool = False,
    workers: int = 1,
    lean: bool = False,
) -> Iterator[Proxy]:
    """``shadow-ab mirror`` as a subprocess: shadow ``rate`` of requests (default every one),
    guard off, overload shedding as ``shed`` says; records to the Kafka sink at ``kafka``
    (topics of this run, deleted after), else to the direct sink; ``workers`` mirror processes
    on the port; ``lean``: no logprob asks, capture ``metadata``."""
    sink: dict[str, Any] = {}
    topics: list[str] = []
    if kafka is not None:
        run = f"bench-mirror-{name}-{uuid.uuid4().hex[:8]}"
        topics = [f"{run}.exchanges", f"{run}.health"]
        ensure_topics(kafka, [TopicSpec(topics[0], 6), TopicSpec(topics[1], 1)])
        sink = {
            "topic_exchanges": topics[0],
            "topic_health": topics[1],
            "spool_dir": str(workdir / f"spool-{name}"),
        }
    db = None if kafka is not None else database_url or f"sqlite:///{workdir / (name + '.db')}"
    with contextlib.ExitStack() as cleanup:
        if kafka is not None:
            cleanup.callback(delete_topics, kafka, topics)
        mirror = cleanup.enter_context(
            dev_running_mirror(
                incumbent,
                candidate,
                database_url=db,
                kafka=kafka,
                kafka_settings=sink,
                deployment=f"bench-{name}",
                startup_timeout=180.0,
                shadow={
                    "rate": rate,
                    "max_concurrent": 512,
                    "timeout_s": 60.0,
                    **({"top_logprobs": None} if lean else {}),
                },
                privacy={"capture": "metadata" if lean else "full"},
                guard={"enabled": False},
                overload={"enabled": shed},
                workers=workers,
            )
        )
        models = mirror.base_url + "/v1/models"
        mirror.wait_until(lambda: answers(models), f"answering {models}", 60.0, interval=0.1)
        more = [f"http://{mirror.host}:{mirror.admin_port + i}/metrics" for i in range(1, workers)]
        yield Proxy(mirror.base_url, mirror.pid, mirror.admin_url + "/metrics", more)


def mirror_available() -> str | None:
    """None when ``shadow-ab mirror`` can run here, else why not."""
    for module in ("mirror.cli", "mirror.app"):
        try:
            found = importlib.util.find_spec(module)
        except ImportError as exc:
            return f"{module} is not importable ({exc})"
        if found is None:
            return f"{module} does not exist yet"
    return None


@dataclass
class Scrape:
    """What a mirror's /metrics say at one moment: sampled requests, and two histograms'
    cumulative counts by upper bound: the loop lag (``shadow_ab_mirror_loop_lag_seconds``)
    and the mirror's own added time before the client's first byte
    (``shadow_ab_mirror_added_seconds``)."""

    sampled: float = 0.0
    lag: dict[float, float] = field(default_factory=dict)
    added: dict[float, float] = field(default_factory=dict)

    def __add__(self, other: Scrape) -> Scrape:
        return Scrape(
            self.sampled + other.sampled,
            _merge(self.lag, other.lag, 1.0),
            _merge(self.added, other.added, 1.0),
        )

    def __sub__(self, other: Scrape) -> Scrape:
        return Scrape(
            self.sampled - other.sampled,
            _merge(self.lag, other.lag, -1.0),
            _merge(self.added, other.added, -1.0),
        )


def _merge(a: dict[float, float], b: dict[float, float], sign: float) -> dict[float, float]:
    return {k: a.get(k, 0.0) + sign * b.get(k, 0.0) for k in a.keys() | b.keys()}


def scrape_mirror(metrics_url: str | None) -> Scrape | None:
    """A mirror's sampled count and loop-lag buckets, or None when it does not answer."""
    if metrics_url is None:
        return None
    status, body = http_get(metrics_url, timeout=2.0)
    if status != 200:
        return None
    out = Scrape()
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("shadow_ab_mirror_shadow_decisions_total{") and (
            'decision="sampled"' in line
        ):
            out.sampled += float(line.rsplit(" ", 1)[1])
        elif line.startswith("shadow_ab_mirror_loop_lag_seconds_bucket{"):
            out.lag[_le(line)] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("shadow_ab_mirror_added_seconds_bucket{"):
            out.added[_le(line)] = float(line.rsplit(" ", 1)[1])
    return out


def _le(line: str) -> float:
    return float(line.split('le="', 1)[1].split('"', 1)[0])


def bucket_quantile(lag: dict[float, float], q: float) -> float | None:
    """The upper bound of the histogram bucket holding quantile ``q`` (None without ticks)."""
    total = lag.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for le in sorted(lag):
        if lag[le] >= q * total:
            return le
    return None


# -- nginx -----------------------------------------------------------------------------------

NGINX_CONF = """\
# A private nginx for bench/mirror_overhead.py: own prefix, no /etc/nginx sites.
worker_processes 1;
daemon off;
master_process on;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    client_body_buffer_size 1m;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    upstream incumbent {{ server {incumbent}; keepalive 512; }}
    upstream candidate {{ server {candidate}; keepalive 512; }}
    upstream slow {{ server {slow}; keepalive 512; }}
    server {{
        listen 127.0.0.1:{pass_port};
        location / {{
            proxy_pass http://incumbent;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
{mirror_servers}}}
"""

NGINX_MIRROR_SERVER = """\
    server {{
        listen 127.0.0.1:{port};
        location / {{
            mirror /_shadow;
            mirror_request_body on;
            proxy_pass http://incumbent;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
        location = /_shadow {{
            internal;
            proxy_pass http://{upstream}$request_uri;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
"""


def _which_nginx() -> str:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else "")


def nginx_binary(install: bool = True) -> tuple[str, str | None]:
    """Debian's nginx, installed with apt-get (``nginx-light``) when absent and ``install``:
    (the binary, None), or ("", why there is none)."""
    found = _which_nginx()
    if found:
        return found, None
    if not install:
        return "", "nginx is not installed (and --no-install-nginx was given)"
    print(
        "nginx is not installed: installing Debian's nginx-light with `apt-get install -y"
        " nginx-light` (the bench runs it as a private instance; /etc/nginx is left alone)",
        file=sys.stderr,
        flush=True,
    )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "nginx-light"]
    try:
        if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL)
    except OSError as exc:
        return "", f"nginx is not installed and apt-get could not run ({exc})"
    found = _which_nginx()
    if not found:
        return "", (
            "nginx is not installed and `apt-get install -y nginx-light` did not install it"
            " (as root: apt-get update && apt-get install -y nginx-light)"
        )
    return found, None


@contextlib.contextmanager
def running_nginx(
    incumbent: str, candidate: str, slow: str, workdir: Path
) -> Iterator[dict[str, Proxy]]:
    """One private nginx master + worker, a server per nginx path: ``nginx`` (proxy_pass),
    ``nginx-mirror`` (``mirror`` to ``candidate``), ``nginx-mirror-slow`` (to ``slow``)."""
    binary, why = nginx_binary()
    if why is not None:
        raise BenchError(why)
    prefix = workdir / "nginx"
    prefix.mkdir()
    prefix.chmod(0o755)  # workers run as nobody
    ports = {path: free_port() for path in NGINX_PATHS}
    mirrors = {"nginx-mirror": "candidate", "nginx-mirror-slow": "slow"}
    conf = prefix / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(
            prefix=prefix,
            incumbent=incumbent.removeprefix("http://"),
            candidate=candidate.removeprefix("http://"),
            slow=slow.removeprefix("http://"),
            pass_port=ports["nginx"],
            mirror_servers="".join(
                NGINX_MIRROR_SERVER.format(port=ports[path], upstream=upstream)
                for path, upstream in mirrors.items()
            ),
        )
    )
    cmd = [binary, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
    nginx = Nginx(cmd, prefix)
    try:
        for port in ports.values():
            health = f"http://127.0.0.1:{port}/health"
            nginx.wait_until(partial(answers, health), f"answering {health}", 30.0, interval=0.1)
        yield {path: Proxy(f"http://127.0.0.1:{port}", nginx.pid) for path, port in ports.items()}
    finally:
        with contextlib.suppress(BenchError):  # killed when SIGQUIT did not stop it
            nginx.stop(sig=signal.SIGQUIT)


@contextlib.contextmanager
def running_floor(
    incumbent: str, candidate: str, workdir: Path, record: bool = False
) -> Iterator[Proxy]:
    """``bench/tee_floor.py`` on a free port: the incumbent relayed, the candidate teed;
    with ``record``, both answers parsed and recorded to a file in ``workdir``."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).with_name("tee_floor.py")), "--port", str(port)]
    cmd += ["--incumbent", incumbent, "--candidate", candidate]
    if record:
        cmd += ["--record", str(workdir / f"floor-{port}.jsonl")]
    floor = ManagedProcess(cmd, workdir / f"floor-{port}.log", merge_stdout=True)
    try:
        health = f"http://127.0.0.1:{port}/health"
        floor.wait_until(partial(answers, health), f"answering {health}", 30.0, interval=0.1)
        yield Proxy(f"http://127.0.0.1:{port}", floor.pid)
    finally:
        floor.stop()


# -- candidates going idle between segments --------------------------------------------------


def wait_trt_idle(sim: RunningSim, timeout: float = 90.0) -> None:
    """Until the TensorRT-LLM simulator has nothing running or queued.

    Its /metrics drains the iteration stats it returns (the mirror's health sampler drains
    them too), so an empty list means "no iteration since the last read by anyone": idle is
    a last stat with nothing active, or three empty reads in a row."""
    deadline = time.monotonic() + timeout
    empty = 0
    while time.monotonic() < deadline:
        status, body = http_get(sim.base_url + "/metrics", timeout=2.0)
        stats = json.loads(body) if status == 200 and body else []
        if stats:
            last = stats[-1]
            if last.get("numActiveRequests", 1) == 0 and last.get("numQueuedRequests", 1) == 0:
                return
            empty = 0
        else:
            empty += 1
            if empty >= 3:
                return
        time.sleep(0.35)
    print(f"warning: {sim.base_url} still busy after {timeout}s", file=sys.stderr)


# -- measuring -------------------------------------------------------------------------------


@dataclass
class Segment:
    """One path's measured segment at one concurrency in one round."""

    rows: list[RequestRow]
    wall_s: float
    proxy_cpu_s: float

    def result(self) -> TrafficResult:
        return TrafficResult(rows=self.rows, wall_s=self.wall_s)

    def cpu_ms_per_request(self) -> float:
        """The proxy's CPU over the segment per request answered, in ms (NaN for none)."""
        ok = len(self.result().ok_rows)
        return self.proxy_cpu_s / ok * 1000 if ok else math.nan


FIGURES: dict[str, Callable[[Segment], float]] = {
    "req_s": lambda s: s.result().requests_per_s,
    "ttft_p50": lambda s: s.result().p50("ttft_s"),
    "ttft_p99": lambda s: s.result().p99("ttft_s"),
    "e2e_p50": lambda s: s.result().p50("e2e_s"),
    "e2e_p99": lambda s: s.result().p99("e2e_s"),
    "cpu_ms": Segment.cpu_ms_per_request,
}
"""A segment's figures; a path's is the median of its figure over the rounds."""


def median(xs: list[float]) -> float:
    """The median of the values that are numbers (NaN when none is)."""
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else math.nan


@dataclass
class Cell:
    """One path at one concurrency: its segment in each round, and the mirror's histograms and
    counts summed over them."""

    path: str
    concurrency: int
    segments: dict[int, Segment] = field(default_factory=dict)
    """By round."""
    machine_busy: float = 0.0
    machine_total: float = 0.0
    sampled: float | None = None
    lag: dict[float, float] = field(default_factory=dict)
    """Loop-lag histogram counts of the measured segments (mirror paths)."""
    added: dict[float, float] = field(default_factory=dict)
    """The mirror's own added-time histogram counts of the measured segments."""

    def rows(self) -> list[RequestRow]:
        return [row for seg in self.segments.values() for row in seg.rows]

    def per_round(self, figure: str) -> dict[int, float]:
        return {r: FIGURES[figure](seg) for r, seg in self.segments.items()}

    def figure(self, figure: str) -> float:
        """The median over rounds of the figure."""
        return median(list(self.per_round(figure).values()))

    def minus(self, base: Cell, figure: str) -> list[float]:
        """Per round both ran: this path's figure minus ``base``'s in the same round."""
        b = base.per_round(figure)
        return [v - b[r] for r, v in self.per_round(figure).items() if r in b]

    def ratio(self, base: Cell, figure: str) -> list[float]:
        """Per round both ran: this path's figure over ``base``'s in the same round."""
        b = base.per_round(figure)
        return [v / b[r] for r, v in self.per_round(figure).items() if b.get(r)]


@dataclass
class Target:
    path: str
    base_url: str
    pid: int | None
    metrics_url: str | None = None
    settle: list[RunningSim] = field(default_factory=list)
    more_metrics: list[str] = field(default_factory=list)
    """The other workers' metrics (their CPU is in ``pid``'s process tree)."""

    def cpu_seconds(self) -> float:
        """The proxy's process tree's CPU seconds so far."""
        return tree_cpu_seconds(self.pid) if self.pid else 0.0

    def scrape(self) -> Scrape | None:
        """Summed over the workers; None when one does not answer (or no metrics)."""
        scrapes = [scrape_mirror(u) for u in [self.metrics_url, *self.more_metrics]]
        if any(sc is None for sc in scrapes):
            return None
        return sum((sc for sc in scrapes if sc is not None), Scrape())


async def measure(
    target: Target,
    cell: Cell,
    rnd: int,
    mix: TrafficMix,
    duration_s: float | None,
    requests: int | None,
    seed: int,
) -> None:
    """One segment of ``target`` at the cell's concurrency, round ``rnd``: a warm-up on the
    segment's own session (discarded), the candidates idle, then the measured traffic."""
    conc = cell.concurrency
    async with make_session() as session:
        warm = make_plan(concurrency=conc, requests=max(2 * conc, 10), seed=seed)
        await run_traffic(session, target.base_url, mix, warm)
        for sim in target.settle:
            await asyncio.to_thread(wait_trt_idle, sim)
        plan = make_plan(concurrency=conc, duration_s=duration_s, requests=requests, seed=seed)
        scrape0 = target.scrape()
        cpu0 = target.cpu_seconds()
        busy0, total0 = machine_busy()
        result = await run_traffic(session, target.base_url, mix, plan)
        busy1, total1 = machine_busy()
        cpu1 = target.cpu_seconds()
        scrape1 = target.scrape()
    cell.segments[rnd] = Segment(result.rows, result.wall_s, cpu1 - cpu0)
    cell.machine_busy += busy1 - busy0
    cell.machine_total += total1 - total0
    if scrape0 is not None and scrape1 is not None:
        delta = scrape1 - scrape0
        cell.sampled = (cell.sampled or 0.0) + delta.sampled
        cell.lag = _merge(cell.lag, delta.lag, 1.0)
        cell.added = _merge(cell.added, delta.added, 1.0)
    for sim in target.settle:
        await asyncio.to_thread(wait_trt_idle, sim)


# -- output ----------------------------------------------------------------------------------


def bound(le: float | None, over: str) -> str:
    """A histogram bucket's upper bound as "<= x ms" ("" for none, ``over`` for +Inf)."""
    if le is None:
        return ""
    return over if le == float("inf") else f"<= {ms(le)} ms"


def ms(x: float) -> str:
    return "n/a" if x != x else f"{x * 1000:.2f}"


def signed_ms(x: float) -> str:
    return "n/a" if x != x else f"{x * 1000:+.2f}"


def table(cells: dict[tuple[str, int], Cell], levels: list[int], paths: list[str]) -> list[str]:
    head = (
        "| conc | path | req/s | TTFT p50 | TTFT p99 | E2E p50 | E2E p99 | +TTFT p50 [min, max]"
        " | +TTFT p99 [min, max] | +E2E p50 | +E2E p99 | req/s ratio | proxy CPU ms/req"
        " | shadowed | loop lag p99 | own added p50 / p99 | errors | n |"
    )
    out = [head, "|" + "---|" * 18]
    for conc in levels:
        base = cells.get(("direct", conc))
        for path in paths:
            cell = cells.get((path, conc))
            if cell is None:
                continue
            row = [
                str(conc),
                LABELS[path],
                f"{cell.figure('req_s'):.1f}",
                *(ms(cell.figure(f)) for f in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99")),
            ]
            if base is not None and path != "direct":
                for f in ("ttft_p50", "ttft_p99"):
                    d = cell.minus(base, f)
                    lo, hi = (min(d), max(d)) if d else (math.nan, math.nan)
                    row.append(f"{signed_ms(median(d))} [{signed_ms(lo)}, {signed_ms(hi)}]")
                row += [signed_ms(median(cell.minus(base, f))) for f in ("e2e_p50", "e2e_p99")]
                row.append(f"{median(cell.ratio(base, 'req_s')):.3f}")
            else:
                row += ["", "", "", "", "1.000" if path == "direct" else ""]
            cpu = cell.figure("cpu_ms") if path != "direct" else math.nan
            rows = cell.rows()
            shadowed = "" if path in ("direct", "nginx") else "100% (all)"
            if cell.sampled is not None:
                shadowed = f"{cell.sampled / max(1, len(rows)):.0%}"
            lag = bound(bucket_quantile(cell.lag, 0.99), "> 250 ms")
            a50, a99 = (bucket_quantile(cell.added, q) for q in (0.5, 0.99))
            own = f"{bound(a50, '> 250 ms')} / {bound(a99, '> 250 ms')}" if a50 else ""
            errors = sum(1 for r in rows if not r.ok)
            row += ["" if cpu != cpu else f"{cpu:.3f}", shadowed, lag, own]
            row += [str(errors), str(len(rows))]
            out.append("| " + " | ".join(row) + " |")
    return out


def not_measured(paths: str, levels: str) -> str:
    return f"NOT MEASURED (run with --paths {paths} --concurrency {levels})"


def variants(cells: dict[tuple[str, int], Cell], path: str, conc: int) -> list[Cell]:
    """The cells of ``path`` at ``conc`` (none when it did not run)."""
    return [c for (p, k), c in cells.items() if k == conc and p == path]


def own_verdict(hist: dict[float, float], q: float, goal_s: float) -> tuple[bool, str]:
    """Whether the histogram's ``q`` quantile is within ``goal_s``, and what it says: the
    bucket holding it, and when over, by how much (the bucket's bounds minus the goal)."""
    le = bucket_quantile(hist, q)
    assert le is not None
    below = max((b for b in hist if b < le), default=0.0)
    name = f"p{round(q * 100)}"
    if le <= goal_s:
        return True, f"{name} <= {ms(le)} ms"
    if le == math.inf:
        return False, f"{name} > {ms(below)} ms, over the goal by more than {ms(below - goal_s)} ms"
    least = f"{ms(below - goal_s)}-" if below > goal_s else "up to "
    return False, (
        f"{name} in ({ms(below)}, {ms(le)}] ms, over the goal by {least}{ms(le - goal_s)} ms"
    )


def goal_lines(cells: dict[tuple[str, int], Cell]) -> list[str]:
    """Issue 26's four goals from this run's figures: MET, NOT MET by how much, or NOT
    MEASURED."""
    lo, hi = GOAL_LOW_CONCURRENCY, GOAL_CONCURRENCY
    lines: list[str] = []

    def added(cell: Cell, figure: str) -> float:
        """Median over rounds of the cell's figure minus direct's in the same round."""
        base = cells.get(("direct", cell.concurrency))
        return median(cell.minus(base, figure)) if base is not None else math.nan

    # 1. the mirror's own added time before the first byte, its histogram, at 32 streams
    head = (
        f"Goal 1, the mirror's own added time before the first byte"
        f" (shadow_ab_mirror_added_seconds) p50 <= {ms(GOAL_OWN_P50_S)} ms and"
        f" p99 <= {ms(GOAL_OWN_P99_S)} ms at {hi} streams"
    )
    own = [c for c in variants(cells, "mirror", hi) if c.added.get(math.inf)]
    for cell in own:
        v50, t50 = own_verdict(cell.added, 0.5, GOAL_OWN_P50_S)
        v99, t99 = own_verdict(cell.added, 0.99, GOAL_OWN_P99_S)
        met = "MET" if v50 and v99 else "NOT MET"
        lines.append(f"{head}, {LABELS[cell.path]}: {t50}; {t99} -> {met}")
    if not own:
        lines.append(f"{head}: {not_measured('direct,mirror', str(hi))}")

    # 2. client-side added TTFT p50 at 4 streams within 1 ms of nginx proxy_pass's
    head = (
        f"Goal 2, client-side added TTFT p50 at {lo} streams within"
        f" {ms(GOAL_VS_NGINX_P50_S)} ms of nginx proxy_pass's"
    )
    nginx = cells.get(("nginx", lo))
    mirrors = variants(cells, "mirror", lo)
    n50 = added(nginx, "ttft_p50") if nginx is not None else math.nan
    for cell in mirrors if n50 == n50 else []:
        m50 = added(cell, "ttft_p50")
        over = m50 - n50 - GOAL_VS_NGINX_P50_S
        verdict = "MET" if over <= 0 else f"NOT MET by {ms(over)} ms"
        lines.append(
            f"{head}, {LABELS[cell.path]}: {signed_ms(m50)} ms against nginx's"
            f" {signed_ms(n50)} ms, {signed_ms(m50 - n50)} ms -> {verdict}"
        )
    if n50 != n50 or not mirrors:
        lines.append(f"{head}: {not_measured('direct,nginx,mirror', str(lo))}")

    # 3. at 32 streams, the mirror's added TTFT p50 and p99 no more than nginx mirror's
    for mirror, nginx_path in (("mirror", "nginx-mirror"), ("mirror-slow", "nginx-mirror-slow")):
        head = (
            f"Goal 3, client-side added TTFT p50 and p99 at {hi} streams no more than"
            f" nginx `mirror`'s ({'10x slow' if 'slow' in mirror else 'healthy'} candidate)"
        )
        ngx = cells.get((nginx_path, hi))
        mirrors = variants(cells, mirror, hi)
        if mirror == "mirror":  # the floor against the same bar, for reference
            mirrors += [cells[p, k] for p, k in cells if k == hi and p in ("mirror-lean", *FLOORS)]
        if ngx is None or not mirrors:
            if mirror == "mirror":  # the slow pair is an extra, reported when both ran
                paths = f"direct,{nginx_path},{mirror}"
                lines.append(f"{head}: {not_measured(paths, str(hi))}")
            continue
        n = {f: added(ngx, f) for f in ("ttft_p50", "ttft_p99")}
        for cell in mirrors:
            m = {f: added(cell, f) for f in n}
            short = [f"{f[-3:]} by {ms(m[f] - n[f])} ms" for f in n if not m[f] - n[f] <= 0]
            verdict = "MET" if not short else "NOT MET (" + ", ".join(short) + ")"
            lines.append(
                f"{head}, {LABELS[cell.path]}: p50 {signed_ms(m['ttft_p50'])} ms against"
                f" {signed_ms(n['ttft_p50'])} ms, p99 {signed_ms(m['ttft_p99'])} ms against"
                f" {signed_ms(n['ttft_p99'])} ms -> {verdict}"
            )

    # 4. CPU per shadowed request at most 2x nginx mirror's (healthy) at 32 streams
    head = (
        f"Goal 4, proxy CPU per shadowed request at {hi} streams at most"
        f" {GOAL_CPU_RATIO:g}x nginx `mirror`'s (healthy candidate)"
    )
    ngx = cells.get(("nginx-mirror", hi))
    ncpu = ngx.figure("cpu_ms") if ngx is not None else math.nan
    mirrors = [
        c
        for c in [
            cells[p, k] for p, k in cells if k == hi and p in ("mirror", "mirror-lean", *FLOORS)
        ]
        if c.figure("cpu_ms") == c.figure("cpu_ms")
    ]
    for cell in mirrors if ncpu == ncpu and ncpu > 0 else []:
        cpu = cell.figure("cpu_ms")
        over = cpu - GOAL_CPU_RATIO * ncpu
        verdict = "MET" if over <= 0 else f"NOT MET by {over:.2f} ms a request"
        shadowed = (
            f", {cell.sampled / max(1, len(cell.rows())):.0%} of requests shadowed"
            if cell.sampled is not None
            else ""
        )
        lines.append(
            f"{head}, {LABELS[cell.path]}: {cpu:.2f} ms against {ncpu:.2f} ms, {cpu / ncpu:.2f}x"
            f"{shadowed} -> {verdict}"
        )
    if not (ncpu == ncpu and ncpu > 0) or not mirrors:
        lines.append(f"{head}: {not_measured('direct,nginx-mirror,mirror', str(hi))}")
    return lines


# -- main ------------------------------------------------------------------------------------


async def run_rounds(
    targets: dict[str, Target],
    levels: list[int],
    args: argparse.Namespace,
    mix: TrafficMix,
    progress: Callable[[str], None],
) -> tuple[dict[tuple[str, int], Cell], list[str]]:
    """Every path once per round at each level, in an order shuffled per round (from
    ``args.seed``): the cells, and the orders as lines."""
    cells = {(p, c): Cell(p, c) for p in targets for c in levels}
    per_duration = args.duration / args.repeat if args.requests is None else None
    per_requests = -(-args.requests // args.repeat) if args.requests is not None else None
    # one warm-up pass over every path (connection pools, the mirror's first requests)
    for path, target in targets.items():
        progress(f"warm-up {path}")
        async with make_session() as session:
            plan = make_plan(concurrency=8, requests=60, seed=99)
            await run_traffic(session, target.base_url, mix, plan)
        for sim in target.settle:
            await asyncio.to_thread(wait_trt_idle, sim)
    rng = random.Random(args.seed)
    orders: list[str] = []
    seed = 0
    for rnd in range(args.repeat):
        for conc in levels:
            order = list(targets)
            rng.shuffle(order)
            orders.append(f"round {rnd + 1}, concurrency {conc}: {', '.join(order)}")
            progress(f"round {rnd + 1}/{args.repeat} conc {conc}, order: {', '.join(order)}")
            for path in order:
                seed += 1
                progress(f"round {rnd + 1}/{args.repeat} conc {conc} {path}")
                await measure(
                    targets[path], cells[(path, conc)], rnd, mix, per_duration, per_requests, seed
                )
    return cells, orders


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--concurrency", default="4,32", help="levels, comma-separated")
    ap.add_argument("--duration", type=float, default=24.0, help="seconds per path and level")
    ap.add_argument("--requests", type=int, default=None, help="requests per path and level")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (drift control)")
    ap.add_argument(
        "--seed", type=int, default=0, help="seeds the rounds' shuffled path orders (printed)"
    )
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument(
        "--paths",
        default=",".join(DEFAULT_PATHS),
        help=f"which paths to run, of {', '.join(PATHS)}",
    )
    ap.add_argument("--database-url", default=None, help="the mirror's store (default: SQLite)")
    ap.add_argument(
        "--kafka",
        default=None,
        metavar="HOST:PORT",
        help="records to the Kafka sink there (the production sink; topics of the run, deleted"
        " after) instead of the direct sink",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the cells' summaries")
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument(
        "--pin",
        action="store_true",
        help="give the proxy a core of its own: every proxy on CPU 1; this client, the"
        " simulators and the Kafka broker on CPU 0",
    )
    ap.add_argument(
        "--no-install-nginx",
        action="store_true",
        help="do not apt-get install nginx-light when nginx is missing (its paths are left out)",
    )
    args = ap.parse_args()
    if args.quick:
        args.duration, args.repeat = 3.0, 1
    levels = [int(c) for c in args.concurrency.split(",")]
    wanted = [p for p in args.paths.split(",") if p]
    unknown = {p for p in wanted if p not in PATHS}
    if unknown:
        ap.error(f"unknown paths {sorted(unknown)}; choose from {', '.join(PATHS)}")
    if "direct" not in wanted:
        wanted.insert(0, "direct")
    notes: list[str] = []
    if set(MIRROR_PATHS) & {p for p in wanted} and (why := mirror_available()):
        notes.append(f"shadow-ab mirror paths skipped: {why}")
        wanted = [p for p in wanted if p not in MIRROR_PATHS]

    if set(NGINX_PATHS) & set(wanted):
        _, why = nginx_binary(install=not args.no_install_nginx)
        if why is not None:
            print(f"NGINX MISSING: {why}; the nginx paths are left out", file=sys.stderr)
            notes.append(f"NGINX MISSING, nginx paths left out: {why}")
            wanted = [p for p in wanted if p not in NGINX_PATHS]

    def progress(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    load0 = os.getloadavg()
    mix = TrafficMix.uniform(max_tokens=args.max_tokens)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shadow-ab-bench-")))
        pin_proxy = stack.enter_context(pinned_apart(1, 0)) if args.pin else None
        if args.pin:
            notes.append(
                "pinned (--pin): every proxy on CPU 1; the client, the simulators and the Kafka"
                " broker on CPU 0"
            )
        progress("starting simulators")
        inc = stack.enter_context(
            running_sim("vllm", "clean", overrides=INCUMBENT, ledger=False, startup_timeout=120.0)
        )
        cand = stack.enter_context(
            running_sim("trtllm", "clean", overrides=CANDIDATE, ledger=False, startup_timeout=120.0)
        )
        slow = stack.enter_context(
            running_sim(
                "trtllm", "clean", overrides=SLOW_CANDIDATE, ledger=False, startup_timeout=120.0
            )
        )
        targets: dict[str, Target] = {"direct": Target("direct", inc.base_url, None)}
        for path in wanted:
            if path not in MIRRORS:
                continue
            how = MIRRORS[path]
            progress(f"starting shadow-ab mirror: {LABELS[path]}")
            cand_sim = slow if how.slow else cand
            m = stack.enter_context(
                running_mirror(
                    inc.base_url,
                    cand_sim.base_url,
                    tmp,
                    args.database_url,
                    path,
                    how.rate,
                    args.kafka,
                    shed=how.shed,
                    workers=how.workers,
                    lean=how.lean,
                )
            )
            settle = [cand_sim] if how.rate > 0 else []
            targets[path] = Target(path, m.base_url, m.pid, m.metrics_url, settle, m.more_metrics)
        if set(NGINX_PATHS) & set(wanted):
            progress("starting nginx")
            proxies = stack.enter_context(
                running_nginx(inc.base_url, cand.base_url, slow.base_url, tmp)
            )
            settles = {"nginx": [], "nginx-mirror": [cand], "nginx-mirror-slow": [slow]}
            for path in NGINX_PATHS:
                if path in wanted:
                    proxy = proxies[path]
                    targets[path] = Target(path, proxy.base_url, proxy.pid, None, settles[path])
        for path in ("floor", "floor-record"):
            if path in wanted:
                progress(f"starting the {LABELS[path]}")
                record = path == "floor-record"
                floor = stack.enter_context(running_floor(inc.base_url, cand.base_url, tmp, record))
                targets[path] = Target(path, floor.base_url, floor.pid, None, [cand])
        order = sorted(targets, key=lambda p: (PATHS.index(p), wanted.index(p)))
        targets = {p: targets[p] for p in order}
        if pin_proxy is not None:
            for target in targets.values():
                if target.pid:
                    pin_proxy(target.pid)
        try:
            import uvloop

            runner: Callable[..., Any] = uvloop.run
        except ImportError:
            runner = asyncio.run
        cells, orders = runner(run_rounds(targets, levels, args, mix, progress))
    load1 = os.getloadavg()

    print("## Mirror overhead: client -> incumbent direct vs through a proxy\n")
    print(f"`{' '.join(['python', *sys.argv])}`\n")
    amount = f"{args.duration:g} s" if args.requests is None else f"{args.requests} requests"
    print(
        f"Simulated engines: incumbent vLLM flavor (~40 ms TTFT, 8 ms/token), candidate"
        f" TensorRT-LLM flavor (decode 20% faster), slow candidate 10x slower; answers"
        f" {ANSWERS['min_tokens']}-{ANSWERS['max_tokens']} tokens, max_tokens {args.max_tokens};"
        f" one streaming chat shape, closed loop. Per path and level:"
        f" {amount} over {args.repeat} interleaved round(s) (each round drives every path"
        f" once at a level, in an order shuffled per round), each segment after a warm-up."
        f" Times in ms. Every figure is the median over the rounds of the round's own: a"
        f" percentile of the segment, the proxy's CPU per request answered, and for the '+'"
        f" columns the path's percentile minus direct's in the same round ([min, max] over"
        f" rounds beside it); `shadowed`, `loop lag` and `own added` are over all the"
        f" segments."
    )
    print(
        f"\nThis machine has {os.cpu_count()} cores, shared by the client, three simulators,"
        f" the mirror/nginx and anything else running (load average before"
        f" {load0[0]:.2f}/{load0[1]:.2f}, after {load1[0]:.2f}/{load1[1]:.2f}; the bench's"
        f" processes ran at niceness {os.nice(0)})."
    )
    for note in notes:
        print(f"\nNote: {note}")
    print()
    print("\n".join(table(cells, levels, order)))
    print()
    for line in goal_lines(cells):
        print(line)
    print(f"\nPath orders (shuffled with --seed {args.seed}):")
    for line in orders:
        print(f"- {line}")
    busy = {
        k: c.machine_busy / c.machine_total if c.machine_total else float("nan")
        for k, c in cells.items()
    }
    print(
        "\nMachine CPU busy during the measured segments: "
        + ", ".join(f"{p}@{c} {busy[(p, c)]:.0%}" for p, c in cells)
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    f"{p}@{c}": {
                        "figures": {f: cell.figure(f) for f in FIGURES},
                        "rounds": {
                            str(r + 1): {
                                **seg.result().summary(),
                                "proxy_cpu_s": seg.proxy_cpu_s,
                                **{f: fig(seg) for f, fig in FIGURES.items()},
                            }
                            for r, seg in sorted(cell.segments.items())
                        },
                        "sampled": cell.sampled,
                        "loop_lag_buckets": {str(k): v for k, v in cell.lag.items()},
                        "added_buckets": {str(k): v for k, v in cell.added.items()},
                        "machine_busy": busy[(p, c)],
                    }
                    for (p, c), cell in cells.items()
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
