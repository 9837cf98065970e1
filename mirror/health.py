"""The health sampler: scrapes each engine's ``/health``, ``/version`` and ``/metrics``.

Every ``interval_s`` the sampler scrapes every target concurrently and submits one
:class:`shadow_ab.records.HealthSample` per engine to the record sink (topic ``shadow.health``):

- ``/health``: 200 = up; 503 (or anything else, or no answer) = down;
- ``/version``: the engine's version (``{"version": ...}``);
- ``/metrics``, parsed per flavor: vLLM's Prometheus text (:func:`parse_vllm_metrics`) or
  TensorRT-LLM's JSON list of iteration stats (:func:`parse_trtllm_metrics`; drained by every
  read and often empty, so the last known values are kept and reported again). With flavor
  ``auto`` (the default) every answer is recognised by :func:`detect_flavor` (its content type,
  else its first byte), so an engine replaced by the other kind, or a scrape that failed, is
  read right the next time; an empty answer keeps the flavor last seen.

What vLLM's ``/metrics`` can say about memory: ``process_resident_memory_bytes`` and
``process_start_time_seconds`` describe the API server process only, not the engine core or the
workers, which hold most of the memory (real vLLM 0.32 on CPU: 0.9 GB of 3.9 GB); they are
absent in multiprocess mode. So a vLLM sample's ``cpu_mem_bytes`` is the API server's resident
memory, and its ``gpu_mem_bytes`` is empty (vLLM exports no device memory).

It detects restarts -- a new ``process_start_time_seconds``, an engine seen down and then up
again, or TensorRT-LLM's iteration counter going back -- and version changes; each is counted
(``shadow_ab_engine_restarts_total``, ``shadow_ab_engine_version_changes_total``) and logged.

An engine is outside the trust boundary: each answer is read a piece at a time up to its cap
(:data:`HEALTH_MAX_BYTES` for ``/health`` and ``/version``, :data:`METRICS_MAX_BYTES` for
``/metrics``); a longer one is not read further (its connection is closed) and the scrape fails
(``health_too_large``, ``version_too_large``, ``metrics_too_large``); the status of a long
``/health`` still says whether the engine is up.

Errors: none escape :meth:`HealthSampler.sample_once`. A scrape that fails is stored as such
(``error`` says what failed; a down sample when ``/health`` did not answer 200), counted in
``shadow_ab_mirror_health_scrape_failures_total{engine,role,reason}`` (reasons:
:data:`FAILURE_REASONS`) and logged once per engine when the failures begin, and once when the
scrapes work again, not at every sample. Parsers raise :class:`MetricsParseError` on malformed
input.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, Field

from mirror.errors import MetricsParseError
from mirror.metrics import (
    ENGINE_RESTARTS,
    ENGINE_UP,
    ENGINE_VERSION_CHANGES,
    HEALTH_SCRAPE,
    HEALTH_SCRAPE_FAILURES,
)
from shadow_ab.privacy import redact_urls
from shadow_ab.records import INT32_MAX, HealthSample, Role, utcnow

if TYPE_CHECKING:
    from mirror.sinks import RecordSink

log = logging.getLogger(__name__)

Flavor = Literal["vllm", "trtllm", "auto"]
Known = Literal["vllm", "trtllm"]

FAILURE_REASONS = (
    "health_unreachable",
    "health_timeout",
    "health_status",
    "version",
    "metrics_unreachable",
    "metrics_timeout",
    "metrics_status",
    "metrics_parse",
    "health_too_large",
    "version_too_large",
    "metrics_too_large",
)
"""Why a scrape failed (the ``reason`` label of the failures counter): ``/health`` refused or
dropped the connection, timed out, or answered other than 200; ``/version`` did not give a
version; ``/metrics`` refused, timed out, answered other than 200, or could not be parsed; an
answer longer than its cap (:data:`HEALTH_MAX_BYTES`, :data:`METRICS_MAX_BYTES`), not read
further."""

HEALTH_MAX_BYTES = 64 * 1024
"""The most of a ``/health`` or ``/version`` answer the sampler reads: 64 KiB. vLLM's
``/health`` is empty and its ``/version`` ~25 bytes (``{"version": "0.x.y"}``), TensorRT-LLM's
as small; an engine (outside the trust boundary) sending more is not read further. A module
constant, not a setting: nothing legitimate needs another value."""

METRICS_MAX_BYTES = 4 * 1024 * 1024
"""The most of a ``/metrics`` answer the sampler reads (as received, and after aiohttp's
decompression): 4 MiB. vLLM's Prometheus text is tens of KB for one model and ~1 MB with many
models, LoRA adapters and labels (each histogram is ~20 bucket lines per label set);
TensorRT-LLM's JSON holds the iteration stats since the last read, ~1 KB each and 1,000 at most
by default (``iter_stats_max_iterations``), ~1 MB. Reading and parsing 4 MiB costs the sampler
a few times that (the text, its lines, the decoded copy) within its pod's 512 Mi, where a
gzip bomb read whole would take gigabytes. A module constant, not a setting."""

FLAVOR_NAMES = {"vllm": "vLLM's Prometheus text", "trtllm": "TensorRT-LLM's JSON list"}


TIMEOUT_S = 2.0
"""Timeout of each scrape (a setting until issue 26): an engine's /metrics answers in
milliseconds; one that takes seconds is itself the news, recorded as a failed sample."""


class HealthConfig(BaseModel):
    """Settings of the health sampler (``health:`` in the mirror's YAML)."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(default=5.0, gt=0, description="seconds between scrapes")


@dataclass
class EngineTarget:
    """One engine to scrape: its id (``vllm@incumbent``), role, base URL and flavor."""

    engine: str
    role: Role
    base_url: str
    flavor: Flavor = "auto"


# -- parsers (pure) ---------------------------------------------------------------------------


def detect_flavor(content_type: str, payload: bytes) -> Known | None:
    """Which engine a ``/metrics`` answer comes from: JSON (TensorRT-LLM's iteration stats) or
    Prometheus text (vLLM); None when the answer says neither (empty, of another type)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/json":
        return "trtllm"
    if kind in ("text/plain", "application/openmetrics-text"):
        return "vllm"
    head = payload.lstrip()[:1]
    if head in (b"[", b"{"):
        return "trtllm"
    if head and (head == b"#" or head.isalpha() or head in (b"_", b":")):
        return "vllm"
    return None


def _parse_value(text: str) -> float:
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    return float(text)


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{name: value}``, series of one name summed over labels.

    Histogram buckets and ``_created`` series are left out (``_sum``/``_count`` kept); NaN
    values are skipped.
    """
    out: dict[str, float] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            close = rest.rfind("}")
            if close < 0:
                raise MetricsParseError(f"line {lineno}: unclosed label set: {raw[:80]!r}")
            fields = rest[close + 1 :].split()
        else:
            name, *fields = line.split()
        if not fields:
            raise MetricsParseError(f"line {lineno}: no value: {raw[:80]!r}")
        if name.endswith(("_bucket", "_created")):
            continue
        try:
            value = _parse_value(fields[0])
        except ValueError:
            raise MetricsParseError(f"line {lineno}: bad value {fields[0]!r}") from None
        if math.isnan(value) or math.isinf(value):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def parse_trtllm_metrics(obj: Any) -> dict[str, float]:
    """TensorRT-LLM's iteration stats (a JSON list) -> the newest stat's numbers, flattened.

    Nested objects become dotted names (``kvCacheStats.usedNumBlocks``); ``kv_cache_usage``
    (used / max blocks) is derived. An empty list gives an empty dict.
    """
    if not isinstance(obj, list):
        raise MetricsParseError(
            f"TensorRT-LLM /metrics should be a JSON list, got {type(obj).__name__}"
        )
    stats = [s for s in obj if isinstance(s, dict)]
    if not stats:
        return {}
    newest = max(stats, key=lambda s: s.get("iter", 0) if isinstance(s.get("iter"), int) else 0)
    out: dict[str, float] = {}
    _flatten(newest, "", out)
    used = out.get("kvCacheStats.usedNumBlocks")
    total = out.get("kvCacheStats.maxNumBlocks")
    if used is not None and total:
        out["kv_cache_usage"] = min(1.0, max(0.0, used / total))
    return out


def _flatten(obj: dict[str, Any], prefix: str, out: dict[str, float]) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            out[name] = float(value)
        elif isinstance(value, int | float):
            if math.isfinite(value):
                out[name] = float(value)
        elif isinstance(value, dict):
            _flatten(value, name + ".", out)


def _count(value: float | None) -> int | None:
    if value is None or value < 0:
        return None
    return min(round(value), INT32_MAX)


def _bytes(value: float | None) -> int | None:
    return None if value is None or value < 0 else int(value)


def _ratio(value: float | None) -> float | None:
    return None if value is None else min(1.0, max(0.0, value))


# vLLM names that map onto HealthSample fields.
VLLM_FIELDS = {
    "vllm:num_requests_running": "num_running",
    "vllm:num_requests_waiting": "num_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "process_start_time_seconds": "process_start_time",
    "process_resident_memory_bytes": "cpu_mem_bytes",
}
TRT_FIELDS = {
    "numActiveRequests": "num_running",
    "numQueuedRequests": "num_waiting",
    "kv_cache_usage": "kv_cache_usage",
    "gpuMemUsage": "gpu_mem_bytes",
    "cpuMemUsage": "cpu_mem_bytes",
}


# -- the sampler ------------------------------------------------------------------------------


@dataclass
class _Scrape:
    """What one scrape of one engine found (before it becomes a HealthSample)."""

    up: bool = False
    http_status: int | None = None
    error: str | None = None
    reasons: list[str] = field(default_factory=list)
    """What failed, as :data:`FAILURE_REASONS` entries, in order; empty when all worked."""
    version: str | None = None
    flavor: Literal["vllm", "trtllm", "unknown"] = "unknown"
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def reason(self) -> str | None:
        return self.reasons[0] if self.reasons else None

    def fail(self, reason: str, error: str | None) -> None:
        """Note a failure; the first one with an ``error`` text is the sample's error."""
        self.reasons.append(reason)
        if error is not None and self.error is None:
            self.error = error


@dataclass
class _EngineState:
    """What the sampler remembers about one engine between scrapes."""

    flavor: Literal["vllm", "trtllm", "unknown"] = "unknown"
    seen_up: bool = False
    up: bool | None = None
    version: str | None = None
    start_time: float | None = None
    trt_iter: float | None = None
    trt_last: dict[str, float] = field(default_factory=dict)
    restarts: int = 0
    version_changes: int = 0
    failing: str | None = None
    """The reason of the failure that began the current run of failed scrapes, if any."""
    failed_samples: int = 0


class HealthSampler:
    """Scrapes every target each ``interval_s`` and submits health samples to ``sink``."""

    def __init__(
        self,
        targets: Sequence[EngineTarget],
        sink: RecordSink,
        session: aiohttp.ClientSession,
        deployment: str,
        config: HealthConfig,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utcnow,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.targets = list(targets)
        self.timeout_s = timeout_s
        """Each scrape's whole-request timeout (:data:`TIMEOUT_S`; tests pass a shorter one)."""
        self.sink = sink
        self.session = session
        self.deployment = deployment
        self.config = config
        self._clock = clock
        self._wall = wall
        self._state: dict[str, _EngineState] = {t.engine: _EngineState() for t in self.targets}

    def restarts(self, engine: str) -> int:
        """Restarts seen for ``engine`` since the sampler started."""
        return self._state[engine].restarts

    def version_changes(self, engine: str) -> int:
        return self._state[engine].version_changes

    async def run(self) -> None:
        """Scrape every ``interval_s`` until cancelled."""
        while True:
            started = self._clock()
            try:
                await self.sample_once()
            except Exception:  # never let one bad round stop the sampler
                log.exception("health sampling round failed")
            elapsed = self._clock() - started
            await asyncio.sleep(max(0.0, self.config.interval_s - elapsed))

    async def sample_once(self) -> list[HealthSample]:
        """Scrape every target once; submit and return the samples."""
        samples = await asyncio.gather(*(self._sample(t) for t in self.targets))
        for s in samples:
            self.sink.submit(s)
        return list(samples)

    async def _sample(self, target: EngineTarget) -> HealthSample:
        ts = self._wall()
        t0 = self._clock()
        scrape = await self._scrape(target)
        latency = max(0.0, self._clock() - t0)
        HEALTH_SCRAPE.labels(engine=target.engine).observe(latency)
        ENGINE_UP.labels(engine=target.engine, role=target.role.value).set(
            1.0 if scrape.up else 0.0
        )
        self._note_failures(target, scrape)
        return self._to_sample(target, scrape, ts, latency)

    async def _scrape(self, target: EngineTarget) -> _Scrape:
        out = _Scrape()
        base = target.base_url.rstrip("/")
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with self.session.get(base + "/health", timeout=timeout) as resp:
                out.http_status = resp.status
                drained = await _read_capped(resp, HEALTH_MAX_BYTES)
                out.up = resp.status == 200  # the status says it; the body says nothing
                if not out.up:
                    out.fail("health_status", f"/health answered {resp.status}")
                if drained is None:
                    out.fail("health_too_large", _too_large("/health", HEALTH_MAX_BYTES))
        except TimeoutError as exc:  # before ClientError: aiohttp's timeouts are both
            out.fail("health_timeout", f"/health: {_describe(exc)}")
            return out
        except (aiohttp.ClientError, OSError) as exc:
            out.fail("health_unreachable", f"/health: {_describe(exc)}")
            return out
        # The server answers: /version and /metrics are best effort (a 503 engine may still
        # report its memory). A /version that fails is counted, not the sample's error.
        try:
            async with self.session.get(base + "/version", timeout=timeout) as resp:
                raw = await _read_capped(resp, HEALTH_MAX_BYTES) if resp.status == 200 else b""
            body = orjson.loads(raw) if raw else None
            if raw is None:
                out.fail("version_too_large", None)
            elif isinstance(body, dict) and body.get("version") is not None:
                out.version = str(body["version"])
            else:
                out.fail("version", None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            out.fail("version", None)
        try:
            async with self.session.get(base + "/metrics", timeout=timeout) as resp:
                read = await _read_capped(resp, METRICS_MAX_BYTES)
                content_type = resp.content_type
                status = resp.status
        except TimeoutError as exc:
            out.fail("metrics_timeout", f"/metrics: {_describe(exc)}")
            return out
        except (aiohttp.ClientError, OSError) as exc:
            out.fail("metrics_unreachable", f"/metrics: {_describe(exc)}")
            return out
        if status != 200:
            out.fail("metrics_status", f"/metrics answered {status}")
            return out
        if read is None:
            out.fail("metrics_too_large", _too_large("/metrics", METRICS_MAX_BYTES))
            return out
        payload = read
        flavor = self._flavor(target, content_type, payload)
        out.flavor = flavor
        try:
            if flavor == "trtllm":
                out.metrics = parse_trtllm_metrics(orjson.loads(payload))
            else:
                out.metrics = parse_vllm_metrics(payload.decode("utf-8", "replace"))
        except (MetricsParseError, orjson.JSONDecodeError) as exc:
            out.flavor = "unknown"
            out.fail(
                "metrics_parse",
                f"/metrics: {exc}{_mismatch(target, flavor, content_type, payload)}",
            )
        return out

    def _flavor(self, target: EngineTarget, content_type: str, payload: bytes) -> Known:
        """The configured flavor, else what this answer looks like, else the last one seen
        (vLLM when none was)."""
        if target.flavor != "auto":
            return target.flavor
        detected = detect_flavor(content_type, payload)
        if detected is not None:
            return detected
        known = self._state[target.engine].flavor
        return known if known != "unknown" else "vllm"

    def _note_failures(self, target: EngineTarget, scrape: _Scrape) -> None:
        """Count every failed scrape; log when an engine's scrapes begin to fail, and when they
        work again."""
        st = self._state[target.engine]
        if scrape.reason is not None:
            for reason in scrape.reasons:
                HEALTH_SCRAPE_FAILURES.labels(
                    engine=target.engine, role=target.role.value, reason=reason
                ).inc()
            if st.failing is None:
                log.warning(
                    "health scrape of engine %s (%s) failed: %s [%s]; logged again when it "
                    "works, counted in shadow_ab_mirror_health_scrape_failures_total",
                    target.engine,
                    redact_urls(target.base_url),
                    scrape.error or "/version gave no version",
                    ", ".join(scrape.reasons),
                )
            st.failing = st.failing or scrape.reason
            st.failed_samples += 1
        elif st.failing is not None:
            log.warning(
                "health scrape of engine %s works again after %d failed samples (first: %s)",
                target.engine,
                st.failed_samples,
                st.failing,
            )
            st.failing = None
            st.failed_samples = 0

    def _to_sample(
        self, target: EngineTarget, scrape: _Scrape, ts: datetime, latency: float
    ) -> HealthSample:
        st = self._state[target.engine]
        if scrape.flavor != "unknown":
            st.flavor = scrape.flavor
        metrics = dict(scrape.metrics)
        trt = st.flavor == "trtllm"
        self._detect(
            target,
            st,
            scrape,
            None if trt else metrics.get("process_start_time_seconds"),
            metrics.get("iter") if trt else None,
        )
        if trt and scrape.up:
            if metrics:
                st.trt_last = dict(metrics)
            else:
                metrics = dict(st.trt_last)  # drained and empty: keep the last known values
        names = TRT_FIELDS if trt else VLLM_FIELDS
        fields = {dst: metrics.pop(src, None) for src, dst in names.items()}
        return HealthSample(
            deployment=self.deployment,
            engine=target.engine,
            role=target.role,
            flavor=st.flavor,
            ts=ts,
            up=scrape.up,
            http_status=scrape.http_status,
            latency_s=latency,
            error=redact_urls(scrape.error) if scrape.error else None,
            version=scrape.version,
            process_start_time=fields.get("process_start_time"),
            num_running=_count(fields.get("num_running")),
            num_waiting=_count(fields.get("num_waiting")),
            kv_cache_usage=_ratio(fields.get("kv_cache_usage")),
            gpu_mem_bytes=_bytes(fields.get("gpu_mem_bytes")),
            cpu_mem_bytes=_bytes(fields.get("cpu_mem_bytes")),
            metrics=metrics,
        )

    def _detect(
        self,
        target: EngineTarget,
        st: _EngineState,
        scrape: _Scrape,
        start_time: float | None,
        trt_iter: float | None,
    ) -> None:
        reasons: list[str] = []
        if scrape.up:
            if st.seen_up and st.up is False:
                reasons.append("down then up")
            if start_time is not None and st.start_time is not None and start_time != st.start_time:
                reasons.append(f"process start time {st.start_time} -> {start_time}")
            if trt_iter is not None and st.trt_iter is not None and trt_iter < st.trt_iter:
                reasons.append(f"iteration counter {st.trt_iter:.0f} -> {trt_iter:.0f}")
            if start_time is not None:
                st.start_time = start_time
            if trt_iter is not None:
                st.trt_iter = trt_iter
            st.seen_up = True
        if reasons:
            st.restarts += 1
            st.trt_last = {}  # the old process's numbers are not the new one's
            if trt_iter is None:
                st.trt_iter = None  # a fresh process counts iterations from 0 again
            ENGINE_RESTARTS.labels(engine=target.engine, role=target.role.value).inc()
            log.warning("engine %s restarted (%s)", target.engine, "; ".join(reasons))
        if scrape.version is not None:
            if st.version is not None and scrape.version != st.version:
                st.version_changes += 1
                ENGINE_VERSION_CHANGES.labels(engine=target.engine, role=target.role.value).inc()
                log.warning(
                    "engine %s version changed: %s -> %s", target.engine, st.version, scrape.version
                )
            st.version = scrape.version
        st.up = scrape.up


def _mismatch(target: EngineTarget, used: Known, content_type: str, payload: bytes) -> str:
    """What to do when a configured flavor does not match the answer (empty when it does)."""
    looks = detect_flavor(content_type, payload)
    if target.flavor == "auto" or looks is None or looks == used:
        return ""
    return (
        f" (the answer looks like {FLAVOR_NAMES[looks]}, but flavor is {used}:"
        f" set flavor: {looks} or auto for engine {target.engine})"
    )


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """``resp``'s body, read a piece at a time (decompressed by aiohttp a bounded piece at a
    time); None when it is longer than ``cap`` bytes: read no further, the connection closed."""
    if resp.content_length is not None and resp.content_length > cap:
        resp.close()
        return None
    body = bytearray()
    async for piece in resp.content.iter_any():
        if len(body) + len(piece) > cap:
            resp.close()
            return None
        body += piece
    return bytes(body)


def _too_large(path: str, cap: int) -> str:
    return f"{path} answered more than {cap} bytes: not read further"


def _describe(exc: BaseException) -> str:
    text = redact_urls(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
