"""``shadow-ab incidents``: list a deployment's incidents and compare the engines' rates.

Reads the ``incidents`` table, which detection fills: ``shadow-ab report`` runs detection over
its window, and ``--detect`` here runs it over ``--since``/``--until`` (default: all of the
deployment's data) before listing. The figures are :mod:`evaluator.incidents.query`'s, the same
the query API serves.

Exit status: 0 ok; 1 a store error; 2 a bad argument (unknown deployment, bad time); 3 the
database is unreachable.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import orjson

from evaluator.errors import EvaluatorError
from evaluator.incidents.analysis import detect_incidents
from evaluator.incidents.load import load_detection_input
from evaluator.incidents.model import KINDS, IncidentConfig
from evaluator.incidents.query import (
    check_deployment,
    compare_incidents,
    data_span,
    query_incidents,
)
from evaluator.incidents.store import store_incidents
from evaluator.rates import BUCKETS, By
from shadow_ab.cli_support import parse_time, resolve_url, url_option
from storage.cli_support import storage_errors
from storage.db import make_engine


def _fmt_time(iso: str | None) -> str:
    if iso is None:
        return "-"
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "ongoing"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _fmt_num(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


def summarize(row: dict[str, Any]) -> str:
    """One line of evidence for the table."""
    ev = row["evidence"]
    kind = row["kind"]
    if kind == "leak":
        iv = ev.get("interval") or {}
        return (
            f"{_fmt_num(ev.get('mb_per_hour'), 1)} MB/h"
            f" [{_fmt_num(iv.get('low'), 1)}, {_fmt_num(iv.get('high'), 1)}]"
            f" {ev.get('series', '')}"
        )
    if kind == "crash":
        parts = (
            [f"{ev.get('down_samples', 0)} down samples"] if ev.get("source") == "health" else []
        )
        if ev.get("connection_errors"):
            parts.append(f"{ev['connection_errors']} connection errors")
        if ev.get("still_down_at"):
            parts.append("still down")
        return ", ".join(parts) or ev.get("source", "")
    if kind == "version_change":
        restart = " (restart)" if ev.get("restart") else ""
        return f"{ev.get('from_version')} -> {ev.get('to_version')}{restart}"
    if kind == "error_burst":
        if ev.get("source") == "health":
            return f"/health failing ({ev.get('down_samples', 0)} samples)"
        statuses = ", ".join(f"{k}x{v}" for k, v in sorted((ev.get("statuses") or {}).items()))
        return f"{ev.get('failed')}/{ev.get('sent')} failed ({statuses})"
    if kind == "hang":
        if ev.get("source") == "health":
            return f"/health slow: max {_fmt_num(ev.get('max_latency_s'), 1)}s"
        return (
            f"{ev.get('timeouts', 0)} timeouts, {ev.get('stalled', 0)} stalled,"
            f" max gap {_fmt_num(max(ev.get('max_itl_s') or 0, ev.get('max_ttft_s') or 0), 1)}s"
        )
    return ""


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(out)


def _ratio(c: dict[str, Any]) -> str:
    return "inf" if c.get("unbounded") else _fmt_num(c["ratio"])


def _interval(c: dict[str, Any]) -> str:
    iv = c["interval"]
    high = "inf" if iv["high"] is None else _fmt_num(iv["high"])
    return f"[{_fmt_num(iv['low'])}, {high}]"


def _comparison_line(c: dict[str, Any] | None) -> str:
    if c is None:
        return "rate ratio candidate/incumbent: - (an engine has no observed time)"
    iv = c["interval"]
    return (
        f"rate ratio candidate/incumbent: {_ratio(c)}"
        f" {_interval(c)} ({iv['level']:.0%}, exact"
        f" conditional binomial), p = {c['p_value']:.3g}"
    )


def render_table(rows: list[dict[str, Any]], comparison: dict[str, Any], by: str | None) -> str:
    parts = []
    if rows:
        parts.append(
            _table(
                ["started (UTC)", "lasted", "role", "engine", "kind", "evidence"],
                [
                    [
                        _fmt_time(r["started_at"]),
                        _fmt_duration(r["duration_s"]),
                        r["role"] or "-",
                        r["engine"],
                        r["kind"],
                        summarize(r),
                    ]
                    for r in rows
                ],
            )
        )
    else:
        parts.append("no incidents stored for this selection")
    kinds = comparison["kinds"]
    summary_rows = []
    for role, info in comparison["roles"].items():
        summary_rows.append(
            [
                role,
                *(str(info["counts"][k]) for k in kinds),
                str(info["count"]),
                _fmt_num(info["exposure_days"]),
                _fmt_num(info["rate_per_day"]),
            ]
        )
    parts.append(
        f"\n{comparison['since'][:19]} .. {comparison['until'][:19]} UTC\n"
        + _table(["role", *kinds, "total", "observed days", "per day"], summary_rows)
    )
    parts.append(_comparison_line(comparison["comparison"]))
    if by is not None:
        bucket_rows = []
        for b in comparison["buckets"]:
            inc, cand = b["incumbent"], b["candidate"]
            c = b["comparison"]
            bucket_rows.append(
                [
                    b["bucket"],
                    str(inc["total"]),
                    _fmt_num(inc["exposure_days"]),
                    str(cand["total"]),
                    _fmt_num(cand["exposure_days"]),
                    _ratio(c) if c else "-",
                    _interval(c) if c else "-",
                    f"{c['p_value']:.3g}" if c else "-",
                ]
            )
        parts.append(
            "\n"
            + _table(
                [by, "incumbent", "obs. days", "candidate", "obs. days", "ratio", "interval", "p"],
                bucket_rows,
            )
        )
    return "\n".join(parts)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--deployment", "-d", required=True, help="Deployment name.")
@click.option(
    "--engine",
    "engine_role",
    default=None,
    help="Only this engine: an engine id (e.g. trtllm@candidate) or a role (incumbent, candidate).",
)
@click.option("--kind", type=click.Choice(KINDS), default=None, help="Only this kind.")
@click.option("--since", default=None, help="Incidents that started at or after (ISO 8601, UTC).")
@click.option("--until", default=None, help="...and before this time.")
@click.option(
    "--by",
    type=click.Choice(BUCKETS),
    default=None,
    help="Also count per UTC day or ISO week, with the exact rate comparison per bucket.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.option(
    "--detect",
    is_flag=True,
    help="Run incident detection over --since/--until first (default: all the deployment's"
    " data) and store what it finds (idempotent). `shadow-ab report` does this for its window.",
)
@url_option
@storage_errors
def incidents(
    deployment: str,
    engine_role: str | None,
    kind: str | None,
    since: str | None,
    until: str | None,
    by: str | None,
    fmt: str,
    detect: bool,
    database_url: str | None,
) -> None:
    """List a deployment's incidents and compare the candidate's rate with the incumbent's."""
    since_t, until_t = parse_time(since, "--since"), parse_time(until, "--until")
    if since_t and until_t and until_t <= since_t:
        raise click.BadParameter("must be after --since", param_hint="--until")
    engine = make_engine(resolve_url(database_url))
    try:
        detected = None
        if detect:
            detected = _detect(engine, deployment, since_t, until_t)
        rows = query_incidents(
            engine, deployment, engine_role=engine_role, kind=kind, since=since_t, until=until_t
        )
        bucket: By = "week" if by == "week" else "day"
        comparison = compare_incidents(
            engine, deployment, by=bucket, kind=kind, since=since_t, until=until_t
        )
    except EvaluatorError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from exc
    finally:
        engine.dispose()
    if fmt == "json":
        doc = {"incidents": rows, "comparison": comparison, "detected": detected}
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=_json_default).decode())
        return
    if detected is not None:
        click.echo(
            f"detected {detected['found']} incidents over {detected['from'][:19]} .."
            f" {detected['to'][:19]} UTC ({detected['new']} new)\n"
        )
    click.echo(render_table(rows, comparison, by))
    if not rows and not detect:
        click.echo(
            "\n(incidents are stored by `shadow-ab report`; add --detect to run detection now)"
        )


def _json_default(value: Any) -> Any:
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")


def _detect(
    engine: Any, deployment: str, since: datetime | None, until: datetime | None
) -> dict[str, Any]:
    check_deployment(engine, deployment)
    if since is None or until is None:
        span = data_span(engine, deployment)
        if span is None:
            return {"found": 0, "new": 0, "from": "", "to": ""}
        since = since or span[0]
        until = until or span[1] + timedelta(microseconds=1)
    config = IncidentConfig()
    data = load_detection_input(engine, deployment, (since, until), config)
    findings = detect_incidents(data, config)
    return {
        "found": len(findings),
        "new": store_incidents(engine, deployment, findings),
        "from": since.isoformat(),
        "to": until.isoformat(),
    }
