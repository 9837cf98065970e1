"""What shadow-ab's mirror adds to the client's path, next to going direct and next to nginx.

    python bench/mirror_overhead.py [--duration 24 | --requests N] [--concurrency 1,32,128]
        [--repeat 3] [--max-tokens 32] [--quick] [--database-url URL] [--json PATH]
        [--paths direct,nginx,nginx-mirror,mirror,wire,native] [--no-install-nginx]
        [--kafka HOST:PORT]

Engines (``shadow-ab sim`` subprocesses, real HTTP on 127.0.0.1):

- incumbent: vLLM flavor at DESIGN's reference speed, ~40 ms TTFT (prefill 30 ms + one 8 ms
  decode step) then 8 ms a token, short answers (16-24 tokens, ``max_tokens`` 32);
- candidate: TensorRT-LLM flavor, the same prefill, decode 20% faster;
- slow candidate: TensorRT-LLM flavor, 10x slower (prefill 300 ms, decode 80 ms a token).

Paths, side by side in one run, each with its own keep-alive client session:

- ``direct``: client -> incumbent;
- ``mirror``: client -> ``shadow-ab mirror`` -> incumbent, shadowing every request (sample rate
  1.0, guard off so nothing is backed off, shadow cap 512) to the candidate; records to the
  direct sink on a temporary SQLite file (or ``--database-url``);
- ``mirror-slow``: the same with the 10x slower candidate;
- ``mirror-off``: the same mirror with shadow rate 0 (the serving path's own cost, for scale);
- ``wire``, ``wire-slow``, ``wire-off``: the same three on the protocol data plane
  (``data_plane: protocol``, mirror/wire.py, the default); ``mirror*`` are the ASGI plane
  (``data_plane: asgi``, kept selectable). Default paths: direct, nginx, nginx-mirror, mirror,
  wire (both planes; the shadow side is the same raw-connection client on both);
- ``wire-x2``: ``wire`` with ``workers: 2``, two mirror processes on one port (the kernel
  spreads the connections, mirror/workers.py), one per core; CPU and shadowed counts are summed
  over both;
- ``wire-shed``: ``wire`` with the mirror's overload shedding on (``overload.enabled``, its
  default lags: mirror/overload.py): shadowing scales down while the mirror's loop lags, and
  the ``shadowed`` column says how much was still shadowed;
- ``front``, ``front-slow``, ``front-off``, ``front-shed``: the same on the native data plane
  (``data_plane: native``, mirror/front.py): the generate routes' bytes in the compiled front
  (``make front`` builds it; the CPU and pinning cover it, a child of the mirror);
  ``front-nice0``: ``front`` with the shadow side at niceness 0 instead of the default 10
  (``front.shadow_nice``);
- ``nginx``: a private Debian nginx (own prefix and config in a temp dir, free ports, one
  worker, ``proxy_buffering off``, upstream keep-alive) with ``proxy_pass`` only;
- ``nginx-mirror``: the same plus nginx's ``mirror`` directive to the 10x slower candidate;
- ``native``, ``native-off``: ``bench/native_plane``, a Go yardstick doing the mirror's
  hot-path work per request (forward and stream, a copy to the candidate read to the end, both
  streams parsed, two JSON records to Kafka at ``--kafka`` or dropped), built with ``go build``
  (its one module, franz-go, from the Go module proxy); ``native-off`` only forwards. Not a data
  plane of shadow-ab: it says what compiled code costs for the same work
  (mirror/README.md, "A compiled plane, measured"). Without Go the output says NATIVE MISSING.

With ``--kafka``, records go to the production Kafka sink (topics of the run).

nginx is installed with ``apt-get install -y nginx-light`` when absent (the bench says so
first; when it cannot be installed, or with ``--no-install-nginx``, the nginx paths are left
out and the output says NGINX MISSING); it
runs as its own master process with ``daemon off`` and never reads /etc/nginx's sites.

Traffic (``shadow_ab.dev.traffic``, uniform mode): one fixed streaming greedy chat request shape,
closed loop at each concurrency; TTFT (first SSE event with non-empty ``choices``) and E2E (last
such event) measured by the client on a monotonic clock. Per concurrency level and round the
paths run one after another in a rotated order (``--repeat`` rounds; rows pooled per path), each
segment after a warm-up on its own session (discarded), and after the candidates went idle.
Added latency = path minus direct at the same percentile, with a bootstrap 95% interval for the
added TTFT. ``proxy CPU ms/req``: user + system CPU of the proxy's process tree (from
/proc/<pid>/stat) over the measured segment, divided by the requests answered (the mirror's
includes reading the candidate's stream and writing records); on the native plane the client's
path alone, the front's process, is shown beside it as ``(front ...)``. ``shadowed`` is the
share of requests the mirror sent to the candidate (from its /metrics). ``loop lag p99`` is the
mirror's own queueing (``shadow_ab_mirror_loop_lag_seconds``, mirror/overload.py): the bucket
bound under which 99 % of its 50 ms timer's ticks fired late during the measured segments,
summed over its workers. ``own added p50 / p99`` is the mirror's own account of what it added
before the client's first byte (``shadow_ab_mirror_added_seconds``: the time from reading the
request to asking the incumbent, plus from reading the first chunk to writing it), as bucket
bounds; it leaves out what the client's clock sees and the mirror cannot (the kernel's queues,
the process waiting for a core), and it has no figure for nginx.

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
import os
import shutil
import signal
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

import numpy as np

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
    quantile,
    run_traffic,
)
from shadow_ab.topics import TopicSpec, delete_topics, ensure_topics

GOAL_CONCURRENCY = 32
GOAL_TTFT_P50_MS = 1.0
GOAL_TTFT_P99_MS = 5.0

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
    "mirror-off",
    "mirror",
    "mirror-slow",
    "wire-off",
    "wire",
    "wire-slow",
    "wire-shed",
    "wire-x2",
    "front-off",
    "front",
    "front-slow",
    "front-shed",
    "front-nice0",
    "native-off",
    "native",
)
DEFAULT_PATHS = ("direct", "nginx", "nginx-mirror", "mirror", "wire")
NGINX_PATHS = ("nginx", "nginx-mirror")
NATIVE_DIR = Path(__file__).resolve().parent / "native_plane"


@dataclass(frozen=True)
class MirrorPath:
    """How a mirror path's ``shadow-ab mirror`` runs."""

    plane: str
    """``data_plane``: ``asgi``, ``protocol`` or ``native``."""
    rate: float
    """The shadow rate."""
    slow: bool = False
    """The candidate is the 10x slower simulator."""
    shed: bool = False
    """``overload.enabled`` (its default lags)."""
    workers: int = 1
    """Mirror processes on the port (``workers``)."""
    nice: int | None = None
    """``front.shadow_nice`` (the native front's shadow side at this niceness; None: the
    default, 10)."""


MIRRORS = {
    "mirror-off": MirrorPath("asgi", 0.0),
    "mirror": MirrorPath("asgi", 1.0),
    "mirror-slow": MirrorPath("asgi", 1.0, slow=True),
    "wire-off": MirrorPath("protocol", 0.0),
    "wire": MirrorPath("protocol", 1.0),
    "wire-slow": MirrorPath("protocol", 1.0, slow=True),
    "wire-shed": MirrorPath("protocol", 1.0, shed=True),
    "wire-x2": MirrorPath("protocol", 1.0, workers=2),
    "front-off": MirrorPath("native", 0.0),
    "front": MirrorPath("native", 1.0),
    "front-slow": MirrorPath("native", 1.0, slow=True),
    "front-shed": MirrorPath("native", 1.0, shed=True),
    "front-nice0": MirrorPath("native", 1.0, nice=0),
}
MIRROR_PATHS = tuple(MIRRORS)
LABELS = {
    "direct": "direct",
    "mirror-off": "mirror asgi, shadowing off",
    "mirror": "mirror asgi, candidate",
    "mirror-slow": "mirror asgi, 10x slow candidate",
    "wire-off": "mirror protocol (default), shadowing off",
    "wire": "mirror protocol (default), candidate",
    "wire-slow": "mirror protocol (default), 10x slow candidate",
    "wire-shed": "mirror protocol, candidate, overload shedding on",
    "wire-x2": "mirror protocol, candidate, 2 processes on one port",
    "front-off": "mirror native front, shadowing off",
    "front": "mirror native front, candidate",
    "front-slow": "mirror native front, 10x slow candidate",
    "front-shed": "mirror native front, candidate, overload shedding on",
    "front-nice0": "mirror native front, candidate, shadow side at niceness 0",
    "nginx": "nginx proxy_pass",
    "nginx-mirror": "nginx `mirror`, 10x slow candidate",
    "native-off": "Go reference plane (bench/native_plane), shadowing off",
    "native": "Go reference plane (bench/native_plane), candidate",
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


FRONT_COMM = "shadow-ab-front"
"""The native front's process name (/proc's comm): the client's path on the native plane."""


def tree_cpu_seconds(pid: int) -> tuple[float, float]:
    """User + system CPU seconds of a process and its live descendants, from /proc: all of
    them, and of them the native front's processes (named :data:`FRONT_COMM`)."""
    total, front, tick = 0.0, 0.0, os.sysconf("SC_CLK_TCK")
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        cpu = (int(fields[11]) + int(fields[12])) / tick
        total += cpu
        if head.split("(", 1)[1] == FRONT_COMM:
            front += cpu
    return total, front


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
    data_plane: str = "asgi",
    kafka: str | None = None,
    shed: bool = False,
    workers: int = 1,
    nice: int | None = None,
) -> Iterator[Proxy]:
    """``shadow-ab mirror`` as a subprocess on ``data_plane``: shadow ``rate`` of requests
    (default every one), guard off, overload shedding as ``shed`` says; records to the Kafka
    sink at ``kafka`` (topics of this run, deleted after), else to the direct sink; ``workers``
    mirror processes on the port."""
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
                shadow={"rate": rate, "max_concurrent": 512, "timeout_s": 60.0},
                guard={"enabled": False},
                overload={"enabled": shed},
                data_plane=data_plane,
                workers=workers,
                front={} if nice is None else {"shadow_nice": nice},
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
    server {{
        listen 127.0.0.1:{pass_port};
        location / {{
            proxy_pass http://incumbent;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
    server {{
        listen 127.0.0.1:{mirror_port};
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
            proxy_pass http://candidate$request_uri;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
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
def running_nginx(incumbent: str, candidate: str, workdir: Path) -> Iterator[tuple[Proxy, Proxy]]:
    """One private nginx master + worker: (proxy_pass server, mirror server)."""
    binary, why = nginx_binary()
    if why is not None:
        raise BenchError(why)
    prefix = workdir / "nginx"
    prefix.mkdir()
    prefix.chmod(0o755)  # workers run as nobody
    pass_port, mirror_port = free_port(), free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(
            prefix=prefix,
            incumbent=incumbent.removeprefix("http://"),
            candidate=candidate.removeprefix("http://"),
            pass_port=pass_port,
            mirror_port=mirror_port,
        )
    )
    cmd = [binary, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
    nginx = Nginx(cmd, prefix)
    try:
        for port in (pass_port, mirror_port):
            health = f"http://127.0.0.1:{port}/health"
            nginx.wait_until(partial(answers, health), f"answering {health}", 30.0, interval=0.1)
        yield (
            Proxy(f"http://127.0.0.1:{pass_port}", nginx.pid),
            Proxy(f"http://127.0.0.1:{mirror_port}", nginx.pid),
        )
    finally:
        with contextlib.suppress(BenchError):  # killed when SIGQUIT did not stop it
            nginx.stop(sig=signal.SIGQUIT)


# -- the compiled reference plane ------------------------------------------------------------


class NativePlane(ManagedProcess):
    """bench/native_plane built with ``go build``: a yardstick, not a data plane of shadow-ab."""

    name = "the Go reference plane"
    error = BenchError


def native_binary(workdir: Path) -> tuple[str, str | None]:
    """bench/native_plane built into ``workdir`` (the Go module proxy gives its one dependency,
    franz-go), or why it could not be."""
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else ""
    )
    if not go:
        return "", "Go is not installed (the native path builds bench/native_plane with `go build`)"
    out = workdir / "nativeplane"
    try:
        built = subprocess.run(
            [go, "build", "-o", str(out), "."],
            cwd=NATIVE_DIR,
            capture_output=True,
            text=True,
            timeout=900,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"`go build` in {NATIVE_DIR} could not run ({exc})"
    if built.returncode != 0:
        return "", f"`go build` in {NATIVE_DIR} failed:\n{built.stderr[-1500:]}"
    return str(out), None


@contextlib.contextmanager
def running_native(
    binary: str, incumbent: str, candidate: str, workdir: Path, kafka: str | None, off: bool
) -> Iterator[Proxy]:
    """The Go reference plane shadowing every request to ``candidate`` (``off``: none);
    records to a topic of this run at ``kafka`` (deleted after), else dropped."""
    port = free_port()
    cmd = [binary, "-listen", f"127.0.0.1:{port}", "-incumbent", incumbent, "-candidate", candidate]
    if off:
        cmd.append("-off")
    topics: list[str] = []
    with contextlib.ExitStack() as cleanup:
        if kafka is not None:
            topics = [f"bench-native-{uuid.uuid4().hex[:8]}.exchanges"]
            ensure_topics(kafka, [TopicSpec(topics[0], 6)])
            cleanup.callback(delete_topics, kafka, topics)
            cmd += ["-kafka", kafka, "-topic", topics[0]]
        plane = NativePlane(cmd, workdir / f"native-plane-{port}.log")
        cleanup.callback(plane.stop)
        models = f"http://127.0.0.1:{port}/v1/models"
        plane.wait_until(partial(answers, models), f"answering {models}", 30.0, interval=0.1)
        yield Proxy(f"http://127.0.0.1:{port}", plane.pid)


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
class Cell:
    """One path at one concurrency: rows pooled over rounds, the proxy's CPU and counts."""

    path: str
    concurrency: int
    rows: list[RequestRow] = field(default_factory=list)
    wall_s: float = 0.0
    proxy_cpu_s: float = 0.0
    front_cpu_s: float = 0.0
    """Of ``proxy_cpu_s``, the native front's (the client's path on the native plane)."""
    machine_busy: float = 0.0
    machine_total: float = 0.0
    sampled: float | None = None
    lag: dict[float, float] = field(default_factory=dict)
    """Loop-lag histogram counts of the measured segments (mirror paths)."""
    added: dict[float, float] = field(default_factory=dict)
    """The mirror's own added-time histogram counts of the measured segments."""

    def result(self) -> TrafficResult:
        return TrafficResult(rows=self.rows, wall_s=self.wall_s)


@dataclass
class Target:
    path: str
    base_url: str
    pid: int | None
    metrics_url: str | None = None
    settle: list[RunningSim] = field(default_factory=list)
    more_metrics: list[str] = field(default_factory=list)
    """The other workers' metrics (their CPU is in ``pid``'s process tree)."""

    def cpu_seconds(self) -> tuple[float, float]:
        """The proxy's process tree's CPU seconds so far, and the native front's in it."""
        if not self.pid:
            return 0.0, 0.0
        return tree_cpu_seconds(self.pid)

    def scrape(self) -> Scrape | None:
        """Summed over the workers; None when one does not answer (or no metrics)."""
        scrapes = [scrape_mirror(u) for u in [self.metrics_url, *self.more_metrics]]
        if any(sc is None for sc in scrapes):
            return None
        return sum((sc for sc in scrapes if sc is not None), Scrape())


async def measure(
    target: Target,
    cell: Cell,
    mix: TrafficMix,
    duration_s: float | None,
    requests: int | None,
    seed: int,
) -> None:
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
    cell.rows += result.rows
    cell.wall_s += result.wall_s
    cell.proxy_cpu_s += cpu1[0] - cpu0[0]
    cell.front_cpu_s += cpu1[1] - cpu0[1]
    cell.machine_busy += busy1 - busy0
    cell.machine_total += total1 - total0
    if scrape0 is not None and scrape1 is not None:
        delta = scrape1 - scrape0
        cell.sampled = (cell.sampled or 0.0) + delta.sampled
        cell.lag = _merge(cell.lag, delta.lag, 1.0)
        cell.added = _merge(cell.added, delta.added, 1.0)
    for sim in target.settle:
        await asyncio.to_thread(wait_trt_idle, sim)


def bootstrap_delta(
    a: list[float], b: list[float], q: float, n: int = 400, seed: int = 1
) -> tuple[float, float]:
    """95% interval of quantile(b) - quantile(a), resampling each side."""
    if not a or not b:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a), np.asarray(b)
    ia = rng.integers(0, len(xa), size=(n, len(xa)))
    ib = rng.integers(0, len(xb), size=(n, len(xb)))
    d = np.quantile(xb[ib], q, axis=1) - np.quantile(xa[ia], q, axis=1)
    lo, hi = np.quantile(d, [0.025, 0.975])
    return float(lo), float(hi)


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
        "| conc | path | req/s | TTFT p50 | TTFT p99 | E2E p50 | E2E p99 | +TTFT p50 [95% CI]"
        " | +TTFT p99 [95% CI] | +E2E p50 | +E2E p99 | req/s ratio | proxy CPU ms/req"
        " | shadowed | loop lag p99 | own added p50 / p99 | errors | n |"
    )
    out = [head, "|" + "---|" * 18]
    for conc in levels:
        base = cells.get(("direct", conc))
        br = base.result() if base else None
        for path in paths:
            cell = cells.get((path, conc))
            if cell is None:
                continue
            r = cell.result()
            ttft, e2e = r.values("ttft_s"), r.values("e2e_s")
            row = [
                str(conc),
                LABELS[path],
                f"{r.requests_per_s:.1f}",
                ms(quantile(ttft, 0.5)),
                ms(quantile(ttft, 0.99)),
                ms(quantile(e2e, 0.5)),
                ms(quantile(e2e, 0.99)),
            ]
            if br is not None and path != "direct":
                bt, be = br.values("ttft_s"), br.values("e2e_s")
                deltas = []
                for q in (0.5, 0.99):
                    d = quantile(ttft, q) - quantile(bt, q)
                    lo, hi = bootstrap_delta(bt, ttft, q)
                    deltas.append(f"{signed_ms(d)} [{signed_ms(lo)}, {signed_ms(hi)}]")
                row += deltas
                row += [
                    signed_ms(quantile(e2e, 0.5) - quantile(be, 0.5)),
                    signed_ms(quantile(e2e, 0.99) - quantile(be, 0.99)),
                    f"{r.requests_per_s / br.requests_per_s:.3f}",
                ]
            else:
                row += ["", "", "", "", "1.000" if path == "direct" else ""]
            ok = len(r.ok_rows)
            cpu = f"{cell.proxy_cpu_s / ok * 1000:.3f}" if path != "direct" and ok else ""
            if cell.front_cpu_s and ok:
                cpu += f" (front {cell.front_cpu_s / ok * 1000:.3f})"
            shadowed = "" if path in ("direct", "nginx", "native-off") else "100% (all)"
            if cell.sampled is not None:
                shadowed = f"{cell.sampled / max(1, len(cell.rows)):.0%}"
            lag = bound(bucket_quantile(cell.lag, 0.99), "> 250 ms")
            a50, a99 = (bucket_quantile(cell.added, q) for q in (0.5, 0.99))
            own = f"{bound(a50, '> 250 ms')} / {bound(a99, '> 250 ms')}" if a50 else ""
            row += [cpu, shadowed, lag, own, str(len(r.errors)), str(len(r.rows))]
            out.append("| " + " | ".join(row) + " |")
    return out


def goal_lines(cells: dict[tuple[str, int], Cell]) -> list[str]:
    lines = []
    base = cells.get(("direct", GOAL_CONCURRENCY))
    shadowing = MIRROR_PATHS
    paths = [p for p, _c in cells if p in shadowing]
    for path in sorted(set(paths), key=shadowing.index):
        cell = cells.get((path, GOAL_CONCURRENCY))
        if base is None or cell is None:
            continue
        bt, mt = base.result().values("ttft_s"), cell.result().values("ttft_s")
        d50 = (quantile(mt, 0.5) - quantile(bt, 0.5)) * 1000
        d99 = (quantile(mt, 0.99) - quantile(bt, 0.99)) * 1000
        met = d50 <= GOAL_TTFT_P50_MS and d99 <= GOAL_TTFT_P99_MS
        lines.append(
            f"Goal (added TTFT p50 <= {GOAL_TTFT_P50_MS:g} ms and p99 <= {GOAL_TTFT_P99_MS:g} ms"
            f" at concurrency {GOAL_CONCURRENCY}), {LABELS[path]}: p50 {d50:+.2f} ms,"
            f" p99 {d99:+.2f} ms -> {'MET' if met else 'NOT MET'}"
        )
    nginx = cells.get(("nginx", GOAL_CONCURRENCY))
    for path in sorted(set(paths), key=shadowing.index):
        cell = cells.get((path, GOAL_CONCURRENCY))
        if cell is None or not cell.result().ok_rows:
            continue
        cpu = cell.proxy_cpu_s / len(cell.result().ok_rows) * 1000
        line = (
            f"Proxy CPU per request at concurrency {GOAL_CONCURRENCY}, {LABELS[path]}: {cpu:.2f} ms"
        )
        ncpu = None
        if nginx is not None and nginx.result().ok_rows:
            ncpu = nginx.proxy_cpu_s / len(nginx.result().ok_rows) * 1000
            line += f" vs nginx proxy_pass {ncpu:.2f} ms ({cpu / ncpu:.1f}x)"
        if cell.front_cpu_s:
            front = cell.front_cpu_s / len(cell.result().ok_rows) * 1000
            line += f"; of it the client's path (the front) {front:.2f} ms"
            if ncpu is not None:
                line += f" ({front / ncpu:.1f}x nginx)"
        lines.append(line)
    if not lines:
        lines.append(
            f"Goal (added TTFT p50 <= {GOAL_TTFT_P50_MS:g} ms and p99 <= {GOAL_TTFT_P99_MS:g} ms"
            f" at concurrency {GOAL_CONCURRENCY}): not measured (no shadow-ab mirror cell at"
            f" concurrency {GOAL_CONCURRENCY})"
        )
    return lines


# -- main ------------------------------------------------------------------------------------


async def run_rounds(
    targets: dict[str, Target],
    levels: list[int],
    args: argparse.Namespace,
    mix: TrafficMix,
    progress: Callable[[str], None],
) -> dict[tuple[str, int], Cell]:
    cells = {(p, c): Cell(p, c) for p in targets for c in levels}
    order = list(targets)
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
    seed = 0
    for rnd in range(args.repeat):
        for conc in levels:
            k = (rnd + levels.index(conc)) % len(order)
            for path in order[k:] + order[:k]:
                seed += 1
                progress(f"round {rnd + 1}/{args.repeat} conc {conc} {path}")
                await measure(
                    targets[path], cells[(path, conc)], mix, per_duration, per_requests, seed
                )
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--concurrency", default="1,32,128", help="levels, comma-separated")
    ap.add_argument("--duration", type=float, default=24.0, help="seconds per path and level")
    ap.add_argument("--requests", type=int, default=None, help="requests per path and level")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (drift control)")
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
        if args.concurrency == "1,32,128":
            args.concurrency = "1,32"
    levels = [int(c) for c in args.concurrency.split(",")]
    wanted = [p for p in args.paths.split(",") if p]
    unknown = {p for p in wanted if p not in PATHS}
    if unknown:
        ap.error(f"unknown paths {sorted(unknown)}; choose from {', '.join(PATHS)}")
    if "direct" not in wanted:
        wanted.insert(0, "direct")
    notes: list[str] = []
    if set(MIRROR_PATHS) & set(wanted) and (why := mirror_available()):
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
                    how.plane,
                    args.kafka,
                    shed=how.shed,
                    workers=how.workers,
                    nice=how.nice,
                )
            )
            settle = [cand_sim] if how.rate > 0 else []
            targets[path] = Target(path, m.base_url, m.pid, m.metrics_url, settle, m.more_metrics)
        if native := [p for p in ("native-off", "native") if p in wanted]:
            progress("building and starting the Go reference plane")
            binary, why = native_binary(tmp)
            if why is not None:
                print(f"NATIVE MISSING: {why}; the native paths are left out", file=sys.stderr)
                notes.append(f"NATIVE MISSING, native paths left out: {why}")
            for path in native if why is None else []:
                off = path == "native-off"
                n = stack.enter_context(
                    running_native(binary, inc.base_url, cand.base_url, tmp, args.kafka, off)
                )
                targets[path] = Target(path, n.base_url, n.pid, None, [] if off else [cand])
        if set(NGINX_PATHS) & set(wanted):
            progress("starting nginx")
            plain, mirrored = stack.enter_context(running_nginx(inc.base_url, slow.base_url, tmp))
            if "nginx" in wanted:
                targets["nginx"] = Target("nginx", plain.base_url, plain.pid)
            if "nginx-mirror" in wanted:
                targets["nginx-mirror"] = Target(
                    "nginx-mirror", mirrored.base_url, mirrored.pid, None, [slow]
                )
        order = sorted(targets, key=PATHS.index)
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
        cells = runner(run_rounds(targets, levels, args, mix, progress))
    load1 = os.getloadavg()

    print("## Mirror overhead: client -> incumbent direct vs through a proxy\n")
    print(f"`{' '.join(['python', *sys.argv])}`\n")
    amount = f"{args.duration:g} s" if args.requests is None else f"{args.requests} requests"
    print(
        f"Simulated engines: incumbent vLLM flavor (~40 ms TTFT, 8 ms/token), candidate"
        f" TensorRT-LLM flavor (decode 20% faster), slow candidate 10x slower; answers"
        f" {ANSWERS['min_tokens']}-{ANSWERS['max_tokens']} tokens, max_tokens {args.max_tokens};"
        f" one streaming chat shape, closed loop. Per path and level:"
        f" {amount}"
        f" in {args.repeat} interleaved round(s), after warm-up. Times in ms; '+' columns are"
        f" the path minus direct at the same concurrency."
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
                        **cell.result().summary(),
                        "proxy_cpu_s": cell.proxy_cpu_s,
                        "front_cpu_s": cell.front_cpu_s,
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
