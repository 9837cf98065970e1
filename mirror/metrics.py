"""Prometheus metrics of the mirror, declared once, each with its type and meaning.

The Grafana dashboard and alert rules under ``k8s/`` use these names; a test checks that every
name they use is declared here (or in another part's ``metrics`` module).

| name | type | labels | meaning |
|---|---|---|---|
| shadow_ab_mirror_requests_total | counter | route, code | client requests answered, by route and the status the client got |
| shadow_ab_mirror_upstream_requests_total | counter | role, status | requests sent to an engine, by role and exchange status (ok, http_error, timeout, connection_error, cancelled) |
| shadow_ab_mirror_ttft_seconds | histogram | role | time to first token of streamed answers, by role |
| shadow_ab_mirror_e2e_seconds | histogram | role | time from sending to the last token (or the whole body), by role |
| shadow_ab_mirror_added_seconds | histogram | | time the mirror adds before the first byte reaches the client (its own overhead) |
| shadow_ab_mirror_held_seconds | histogram | | time a stream's finish event was held back until the usage event the mirror hides (to give the finish event its system_fingerprint back) |
| shadow_ab_mirror_inflight_requests | gauge | role | requests in flight to each engine |
| shadow_ab_mirror_shadow_decisions_total | counter | decision | sampled, skipped_sample, skipped_cap, skipped_guard, skipped_malformed, skipped_hostile, skipped_too_large, skipped_load_parity, skipped_overload |
| shadow_ab_mirror_bodies_refused_total | counter | reason | generate bodies past the bounds on JSON work (mirror/body.py), passed to the incumbent unshadowed: too_deep, too_many_containers, too_many_values, too_many_strings |
| shadow_ab_mirror_replays_total | counter | | sampled requests also replayed to the incumbent |
| shadow_ab_mirror_shadow_answers_truncated_total | counter | role | shadow answers (candidate, replay) cut at mirror/shadow_client.py ANSWER_MAX_BYTES, as received or decompressed (recorded as connection_error, "answer truncated at N bytes") |
| shadow_ab_mirror_guard_rate_ratio | gauge | | the guard's current multiplier of the shadow rate, 0..1 |
| shadow_ab_mirror_guard_state | gauge | state | 1 for the guard's current state (steady, backoff, recovering, off_window), else 0 |
| shadow_ab_mirror_guard_incumbent_p95_seconds | gauge | metric | the incumbent's rolling p95 the guard watches (ttft, e2e) |
| shadow_ab_mirror_loop_lag_seconds | histogram | | how late the mirror's periodic timer fired: the time a ready callback (a client's chunk) waited for the event loop (mirror/overload.py) |
| shadow_ab_mirror_overload_admit_ratio | gauge | | the fraction of sampled requests shadowed under the mirror's own load, 0..1 (1 while overload shedding is off) |
| shadow_ab_mirror_records_total | counter | sink, kind | records handed to the sink |
| shadow_ab_mirror_records_dropped_total | counter | reason | records the mirror dropped (spool_full, encode_error, ...) |
| shadow_ab_mirror_sink_errors_total | counter | sink, error | errors the sink met (broker unreachable, send failed, ...) |
| shadow_ab_mirror_spool_records | gauge | | records waiting in the on-disk spool while Kafka is away |
| shadow_ab_mirror_spool_bytes | gauge | | bytes of the on-disk spool |
| shadow_ab_engine_up | gauge | engine, role | 1 when the engine's last health check passed, else 0 |
| shadow_ab_engine_restarts_total | counter | engine, role | restarts the health sampler saw (new process start time or down then up) |
| shadow_ab_engine_version_changes_total | counter | engine, role | version changes the health sampler saw |
| shadow_ab_health_scrape_seconds | histogram | engine | time to scrape one engine's /health, /version and /metrics |
| shadow_ab_mirror_health_scrape_failures_total | counter | engine, role, reason | health scrapes that failed, by what failed (mirror/health.py FAILURE_REASONS: health_unreachable, health_timeout, health_status, version, metrics_unreachable, metrics_timeout, metrics_status, metrics_parse, health_too_large, version_too_large, metrics_too_large); also stored in the sample's error and logged once per run of failures |
| shadow_ab_mirror_edge_rejections_total | counter | reason | client connections or requests the mirror refused before any engine saw them (connection_cap, header_too_large, header_timeout, header_timeout_idle, body_timeout, route_not_allowed, method_not_allowed) |
| shadow_ab_mirror_send_timeouts_total | counter | | client connections closed because the client took none of its answer for `limits.send_timeout_s` (the engine's request is cancelled) |
"""  # noqa: E501 (a table reads better unwrapped)

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Latency buckets for LLM answers: 5 ms .. 2 min.
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
# The mirror's own overhead: 50 us .. 250 ms.
OVERHEAD_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
)

REQUESTS = Counter(
    "shadow_ab_mirror_requests_total",
    "Client requests answered, by route and the HTTP status the client got.",
    ["route", "code"],
)
UPSTREAM_REQUESTS = Counter(
    "shadow_ab_mirror_upstream_requests_total",
    "Requests sent to an engine, by role and exchange status.",
    ["role", "status"],
)
TTFT = Histogram(
    "shadow_ab_mirror_ttft_seconds",
    "Time to first token of streamed answers, by role (docs/architecture.md timing definitions).",
    ["role"],
    buckets=LATENCY_BUCKETS,
)
E2E = Histogram(
    "shadow_ab_mirror_e2e_seconds",
    "Time from sending the request to the last token (or the whole body), by role.",
    ["role"],
    buckets=LATENCY_BUCKETS,
)
ADDED = Histogram(
    "shadow_ab_mirror_added_seconds",
    "Time the mirror adds before the incumbent's first byte reaches the client.",
    buckets=OVERHEAD_BUCKETS,
)
HELD = Histogram(
    "shadow_ab_mirror_held_seconds",
    "Time a stream's finish event was held back until the usage event the mirror hides.",
    buckets=OVERHEAD_BUCKETS,
)
INFLIGHT = Gauge(
    "shadow_ab_mirror_inflight_requests",
    "Requests in flight to each engine, by role.",
    ["role"],
)
SHADOW_DECISIONS = Counter(
    "shadow_ab_mirror_shadow_decisions_total",
    "Shadowing decisions per client request: sampled or the reason it was skipped.",
    ["decision"],
)
BODIES_REFUSED = Counter(
    "shadow_ab_mirror_bodies_refused_total",
    "Generate bodies passed to the incumbent unshadowed because they exceed the mirror's bounds"
    " on JSON work (mirror/body.py), by reason: too_deep, too_many_containers, too_many_values,"
    " too_many_strings.",
    ["reason"],
)
REPLAYS = Counter(
    "shadow_ab_mirror_replays_total",
    "Sampled requests also replayed to the incumbent to measure its own noise.",
)
SHADOW_TRUNCATED = Counter(
    "shadow_ab_mirror_shadow_answers_truncated_total",
    "Shadow answers cut at the most the mirror reads of one (ANSWER_MAX_BYTES), by role.",
    ["role"],
)
ASKS_DROPPED = Counter(
    "shadow_ab_mirror_asks_dropped_total",
    "Asks the mirror adds to the candidate's requests (logprobs) that it stopped adding on a"
    " route after the candidate refused one (400), by route and ask: once per process.",
    ["route", "ask"],
)
GUARD_RATE = Gauge(
    "shadow_ab_mirror_guard_rate_ratio",
    "The interference guard's current multiplier of the shadow rate, 0..1.",
)
GUARD_STATE = Gauge(
    "shadow_ab_mirror_guard_state",
    "1 for the interference guard's current state, else 0.",
    ["state"],
)
GUARD_P95 = Gauge(
    "shadow_ab_mirror_guard_incumbent_p95_seconds",
    "The incumbent's rolling p95 the guard watches, by metric (ttft, e2e).",
    ["metric"],
)
LOOP_LAG = Histogram(
    "shadow_ab_mirror_loop_lag_seconds",
    "How late the mirror's periodic timer fired: the time a ready callback waited for the loop.",
    buckets=OVERHEAD_BUCKETS,
)
OVERLOAD_ADMIT = Gauge(
    "shadow_ab_mirror_overload_admit_ratio",
    "The fraction of sampled requests shadowed under the mirror's own load (1 when not shedding).",
)
RECORDS = Counter(
    "shadow_ab_mirror_records_total",
    "Records the mirror handed to its sink, by sink (kafka, direct) and kind.",
    ["sink", "kind"],
)
RECORDS_DROPPED = Counter(
    "shadow_ab_mirror_records_dropped_total",
    "Records the mirror dropped, by reason.",
    ["reason"],
)
SINK_ERRORS = Counter(
    "shadow_ab_mirror_sink_errors_total",
    "Errors the mirror's sink met, by sink and error kind.",
    ["sink", "error"],
)
SPOOL_RECORDS = Gauge(
    "shadow_ab_mirror_spool_records",
    "Records waiting in the on-disk spool while Kafka is away.",
)
SPOOL_BYTES = Gauge(
    "shadow_ab_mirror_spool_bytes",
    "Bytes of the on-disk spool.",
)
ENGINE_UP = Gauge(
    "shadow_ab_engine_up",
    "1 when the engine's last health check passed, else 0.",
    ["engine", "role"],
)
ENGINE_RESTARTS = Counter(
    "shadow_ab_engine_restarts_total",
    "Engine restarts the health sampler saw (a new process start time, or down then up).",
    ["engine", "role"],
)
ENGINE_VERSION_CHANGES = Counter(
    "shadow_ab_engine_version_changes_total",
    "Engine version changes the health sampler saw.",
    ["engine", "role"],
)
HEALTH_SCRAPE = Histogram(
    "shadow_ab_health_scrape_seconds",
    "Seconds to scrape one engine's /health, /version and /metrics.",
    ["engine"],
    buckets=LATENCY_BUCKETS,
)
HEALTH_SCRAPE_FAILURES = Counter(
    "shadow_ab_mirror_health_scrape_failures_total",
    "Health scrapes of an engine that failed, by what failed (mirror/health.py FAILURE_REASONS).",
    ["engine", "role", "reason"],
)
EDGE_REJECTIONS = Counter(
    "shadow_ab_mirror_edge_rejections_total",
    "Client connections or requests refused by the mirror's limits or routes, by reason.",
    ["reason"],
)
SEND_TIMEOUTS = Counter(
    "shadow_ab_mirror_send_timeouts_total",
    "Client connections closed because the client took none of its answer for send_timeout_s.",
)

PROBES = Counter(
    "shadow_ab_mirror_probes_total",
    "Probe ticks (mirror/probes.py) by decision: sent to both engines, or skipped by the guard,"
    " the shadow cap, load parity, while draining, or for want of a model name.",
    ["decision"],
)
