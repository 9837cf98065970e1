"""Write ``grafana-dashboard.json``, the shadow-ab Grafana dashboard, from the panel list below.

The dashboard is data (committed JSON, shipped as a ConfigMap with the ``grafana_dashboard``
label for Grafana's sidecar); this script is how it is made, so a panel is one line to change.
Every ``shadow_ab_*`` name in a query must be declared in ``mirror/metrics.py``,
``ingester/metrics.py`` or ``storage/metrics.py`` (``tests/k8s/test_observability.py``).

Usage: ``python k8s/observability/make_dashboard.py`` (rewrites the JSON beside it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "grafana-dashboard.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


def quantiles(metric: str, by: str) -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket[{RATE}])))",
            f"p{int(q * 100)} {{{{{by}}}}}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


# (row title, [(panel title, unit, [(expr, legend)], description)])
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]], str]]]] = [
    (
        "Latency by role (mirror's clock, same for both engines)",
        [
            (
                "TTFT by role",
                "s",
                quantiles("shadow_ab_mirror_ttft_seconds", "role"),
                "Time to first token, incumbent vs candidate vs replay.",
            ),
            (
                "E2E by role",
                "s",
                quantiles("shadow_ab_mirror_e2e_seconds", "role"),
                "Send to last token, by role.",
            ),
            (
                "Latency the mirror adds",
                "s",
                [
                    (
                        f"histogram_quantile({q}, sum by (le) "
                        f"(rate(shadow_ab_mirror_added_seconds_bucket[{RATE}])))",
                        f"p{int(q * 100)}",
                    )
                    for q in (0.5, 0.99)
                ],
                "The mirror's own overhead before the client's first byte.",
            ),
            (
                "The mirror's event-loop lag",
                "s",
                [
                    (
                        f"histogram_quantile({q}, sum by (le) "
                        f"(rate(shadow_ab_mirror_loop_lag_seconds_bucket[{RATE}])))",
                        f"p{int(q * 100)}",
                    )
                    for q in (0.5, 0.99)
                ]
                + [("min(shadow_ab_mirror_overload_admit_ratio)", "shadowed share (overload)")],
                "How long a ready callback (a client's next chunk) waits for the mirror's loop;"
                " with overload.enabled, shadowing scales down above scaled_lag_ms.",
            ),
            (
                "Upstream answers by role and status",
                "reqps",
                [
                    (
                        "sum by (role, status) "
                        f"(rate(shadow_ab_mirror_upstream_requests_total[{RATE}]))",
                        "{{role}} {{status}}",
                    )
                ],
                "Requests sent to each engine, by exchange status.",
            ),
        ],
    ),
    (
        "Shadow traffic and the interference guard",
        [
            (
                "Shadow rate (sampled / client requests)",
                "percentunit",
                [
                    (
                        'sum(rate(shadow_ab_mirror_shadow_decisions_total{decision="sampled"}'
                        f"[{RATE}])) / sum(rate(shadow_ab_mirror_requests_total[{RATE}]))",
                        "shadowed",
                    ),
                    (
                        f"sum(rate(shadow_ab_mirror_replays_total[{RATE}])) / "
                        f"sum(rate(shadow_ab_mirror_requests_total[{RATE}]))",
                        "replayed",
                    ),
                ],
                "Share of client requests copied to the candidate (and replayed).",
            ),
            (
                "Skipped shadow requests by reason",
                "reqps",
                [
                    (
                        "sum by (decision) (rate(shadow_ab_mirror_shadow_decisions_total"
                        f'{{decision!="sampled"}}[{RATE}]))',
                        "{{decision}}",
                    )
                ],
                "skipped_sample is the sampling rate;"
                " skipped_cap/guard/overload mean shadow was held back.",
            ),
            (
                "Guard rate multiplier",
                "percentunit",
                [("shadow_ab_mirror_guard_rate_ratio", "{{pod}}")],
                "1 = full configured rate; lower = the guard is backing off.",
            ),
            (
                "Guard state",
                "short",
                [("sum by (state) (shadow_ab_mirror_guard_state)", "{{state}}")],
                "Mirror pods in each guard state.",
            ),
            (
                "Incumbent p95 the guard watches",
                "s",
                [
                    (
                        "max by (metric) (shadow_ab_mirror_guard_incumbent_p95_seconds)",
                        "{{metric}}",
                    )
                ],
                "Rolling p95 of the incumbent, compared with its baseline.",
            ),
            (
                "In flight by role",
                "short",
                [("sum by (role) (shadow_ab_mirror_inflight_requests)", "{{role}}")],
                "Requests in flight to each engine.",
            ),
        ],
    ),
    (
        "Records: sink, spool, ingester",
        [
            (
                "Records handed to the sink / dropped",
                "short",
                [
                    (
                        f"sum by (kind) (rate(shadow_ab_mirror_records_total[{RATE}]))",
                        "sent {{kind}}",
                    ),
                    (
                        f"sum by (reason) (rate(shadow_ab_mirror_records_dropped_total[{RATE}]))",
                        "dropped {{reason}}",
                    ),
                ],
                "Anything dropped is also counted in the store (drops).",
            ),
            (
                "Sink errors",
                "short",
                [
                    (
                        f"sum by (sink, error) (rate(shadow_ab_mirror_sink_errors_total[{RATE}]))",
                        "{{sink}} {{error}}",
                    ),
                    (
                        f"sum by (reason) (rate(shadow_ab_sink_dropped_total[{RATE}]))",
                        "direct sink dropped {{reason}}",
                    ),
                ],
                "Kafka unreachable, sends failed; direct (embedded) sink drops.",
            ),
            (
                "Spool depth",
                "bytes",
                [
                    ("sum by (pod) (shadow_ab_mirror_spool_bytes)", "bytes {{pod}}"),
                    ("sum by (pod) (shadow_ab_mirror_spool_records)", "records {{pod}}"),
                ],
                "Records waiting on disk while Kafka is away (bounded by spool_max_bytes).",
            ),
            (
                "Consumer lag",
                "short",
                [("sum by (topic) (shadow_ab_ingest_consumer_lag)", "{{topic}}")],
                "Messages not yet committed to PostgreSQL by the ingester.",
            ),
            (
                "Rows written / duplicates / DLQ",
                "short",
                [
                    (
                        f"sum by (table) (rate(shadow_ab_ingest_rows_written_total[{RATE}]))",
                        "written {{table}}",
                    ),
                    (
                        f"sum by (table) (rate(shadow_ab_ingest_duplicates_skipped_total[{RATE}]))",
                        "duplicates {{table}}",
                    ),
                    (
                        f"sum by (reason) (rate(shadow_ab_ingest_dlq_messages_total[{RATE}]))",
                        "dlq {{reason}}",
                    ),
                ],
                "Ingester output per second.",
            ),
            (
                "Ingester store retries and pauses",
                "short",
                [
                    (
                        f"sum by (cause) (rate(shadow_ab_ingest_store_retries_total[{RATE}]))",
                        "retries {{cause}}",
                    ),
                    ("max(shadow_ab_ingest_paused)", "paused"),
                    (
                        "histogram_quantile(0.95, sum by (le) "
                        f"(rate(shadow_ab_ingest_batch_write_seconds_bucket[{RATE}])))",
                        "batch write p95 (s)",
                    ),
                ],
                "The ingester pauses consumption while PostgreSQL is away.",
            ),
        ],
    ),
    (
        "Engines (health sampler)",
        [
            (
                "Engine up",
                "short",
                [("max by (role, engine) (shadow_ab_engine_up)", "{{role}} {{engine}}")],
                "1 when the engine's last /health check passed.",
            ),
            (
                "Engine restarts and version changes (1h)",
                "short",
                [
                    (
                        "sum by (role) (increase(shadow_ab_engine_restarts_total[1h]))",
                        "restarts {{role}}",
                    ),
                    (
                        "sum by (role) (increase(shadow_ab_engine_version_changes_total[1h]))",
                        "version changes {{role}}",
                    ),
                ],
                "Restarts seen by the health sampler.",
            ),
            (
                "Health scrape time",
                "s",
                [
                    (
                        "histogram_quantile(0.95, sum by (le, engine) "
                        f"(rate(shadow_ab_health_scrape_seconds_bucket[{RATE}])))",
                        "p95 {{engine}}",
                    )
                ],
                "Time to scrape /health, /version and /metrics of each engine.",
            ),
            (
                "Client requests by code",
                "reqps",
                [
                    (
                        f"sum by (code) (rate(shadow_ab_mirror_requests_total[{RATE}]))",
                        "{{code}}",
                    )
                ],
                "What clients got (the incumbent's answers).",
            ),
        ],
    ),
]


def panel(pid: int, title: str, unit: str, targets: list[tuple[str, str]], desc: str,
          x: int, y: int) -> dict[str, Any]:  # fmt: skip
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row_title, row_panels in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        for i, (title, unit, targets, desc) in enumerate(row_panels):
            panels.append(panel(pid, title, unit, targets, desc, 12 * (i % 2), y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(row_panels) + 1) // 2)
    return {
        "uid": "shadow-ab",
        "title": "shadow-ab: shadow traffic A/B",
        "tags": ["shadow-ab", "llm"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def main() -> None:
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")


if __name__ == "__main__":
    main()
