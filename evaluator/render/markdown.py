"""The review as Markdown: the same content as the HTML page, with each figure's data as a
table instead of a plot (Markdown has no place for inline SVG that every viewer shows)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evaluator.render.html import deployment_rows, section_blocks
from evaluator.render.tables import Table, criteria_table, make_table, measurement_rows, number

ICONS = {"GO": "✅", "NO-GO": "⛔", "INCONCLUSIVE": "⚠️"}


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_md(t: Table) -> str:
    if not t.columns:
        return "_(empty)_\n"
    lines = [
        "| " + " | ".join(_escape(c) for c in t.columns) + " |",
        "|" + "|".join("---" for _ in t.columns) + "|",
    ]
    lines += ["| " + " | ".join(_escape(v) for v in row) + " |" for row in t.rows]
    if t.note:
        lines.append(f"\n_{t.note}_")
    return "\n".join(lines) + "\n"


def _figure_tables(body: Mapping[str, Any]) -> list[Table]:
    """The plotted series as tables: CDF quantiles and weekly p95 per engine, incidents."""
    sections = body.get("sections") or {}
    latency = sections.get("latency") or {}
    out: list[Table] = []
    weekly = (latency.get("plots") or {}).get("weekly_p95") or {}
    rows = []
    for metric, roles in weekly.items():
        for role, series in (roles or {}).items():
            for week, value in zip(
                series.get("weeks") or [], series.get("values") or [], strict=False
            ):
                rows.append({"metric": metric, "role": role, "week": week, "p95": value})
    if rows:
        out.append(make_table("weekly p95 (plotted)", rows))
    timeline = (sections.get("incidents") or {}).get("timeline") or []
    if timeline:
        out.append(make_table("incident timeline (plotted)", timeline))
    hist = ((sections.get("semantic") or {}).get("histograms") or {}).get("similarity") or {}
    edges = hist.get("edges") or []
    rows = [
        {"similarity": f"{lo:g}-{hi:g}", "candidate": c, "replay (floor)": r}
        for lo, hi, c, r in zip(
            edges, edges[1:], hist.get("candidate") or [], hist.get("replay") or [], strict=False
        )
        if c or r
    ]
    if rows:
        out.append(make_table("semantic similarity histogram (plotted)", rows))
    return out


def render_markdown(body: Mapping[str, Any]) -> str:
    verdict = body.get("verdict") or {}
    decision = verdict.get("decision", "INCONCLUSIVE")
    deployment = body.get("deployment") or {}
    window = body.get("window") or {}
    policy = body.get("policy") or {}
    parts = [
        f"# Migration review: {deployment.get('name', '?')}",
        "",
        f"Window {window.get('from')} → {window.get('to')} · generated "
        f"{body.get('generated_at', '')} · policy “{policy.get('name', '?')}”",
        "",
    ]
    parts += [f"> **Note:** {note}\n" for note in body.get("notes") or []]
    parts += [
        f"## {ICONS.get(decision, '')} Verdict: **{decision}**",
        "",
        str(verdict.get("reason", "")),
        "",
        *(
            [
                f"Sequential plan: {verdict['look'].get('text')}. ALERT: beyond the threshold"
                " before the policy's minimum days, or only at its alert level; shown, never a"
                " NO-GO.",
                "",
            ]
            if verdict.get("look")
            else []
        ),
        "## Deployment",
        "",
        table_md(
            make_table(
                "deployment", [{"field": k, "value": v} for k, v in deployment_rows(deployment)]
            )
        ),
        "## Criteria",
        "",
        table_md(criteria_table(verdict)),
    ]
    parts += [f"> {note}\n" for note in policy.get("notes") or []]
    for t in _figure_tables(body):
        parts += [f"### {t.title}", "", table_md(t)]
    for name, tables, notes in section_blocks(body):
        parts += [f"## {name.capitalize()}", ""]
        parts += [f"_{n}_\n" for n in notes]
        for t in tables:
            parts += [f"### {t.title}" + (f" ({t.note})" if t.note else ""), "", table_md(t)]
    parts += ["## All measurements", "", table_md(measurement_rows(body.get("measurements") or []))]
    timings = body.get("timings") or {}
    if timings:
        parts += ["## Timings", ""]
        parts += [f"- {k}: {number(float(v))} s" for k, v in timings.items()]
    return "\n".join(parts) + "\n"
