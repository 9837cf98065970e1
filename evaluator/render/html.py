"""The review as one self-contained HTML page (inline CSS and SVG; no scripts, no external
assets), from the review's JSON body. The layout is ``templates/report.html.j2`` (Jinja2,
autoescaped; only the SVG figures, drawn by us, are inserted unescaped)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape

from evaluator.render.plots import figures
from evaluator.render.tables import (
    Table,
    criteria_table,
    measurement_rows,
    number,
    section_tables,
)

SECTION_ORDER = ("latency", "incidents", "divergence")


def _looks_numeric(text: str) -> bool:
    """A cell that is one number ("12", "-0.5", "6.9e-04", "inf"), not a sentence or a name
    such as "e2e": numbers are right-aligned, words stay left."""
    try:
        float(text.strip())
    except ValueError:
        return False
    return True


def table_html(t: Table) -> Markup:
    """A table; numeric cells right-aligned, outcome cells coloured, ``link`` cells links."""
    head = "".join(f"<th>{escape(c)}</th>" for c in t.columns)
    body = []
    for row in t.rows:
        cells = []
        for col, value in zip(t.columns, row, strict=True):
            cls = value if col == "outcome" else ("num" if _looks_numeric(value) else "")
            attr = f' class="{escape(cls)}"' if cls else ""
            if col == "link" and value.startswith(("/", "https://", "http://")):
                # the query API's pair view (the divergence section's worst pairs)
                cells.append(f'<td><a href="{escape(value)}">side by side</a></td>')
                continue
            cells.append(f"<td{attr}>{escape(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return Markup(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("evaluator.render", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["table"] = table_html
    return env


def deployment_rows(deployment: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(k.replace("_", " "), number(v)) for k, v in deployment.items() if v not in (None, "")]


SETTINGS_TABLES = frozenset({"config", "slo", "method", "n", "exposure days"})
"""Tables of how a section was computed: shown after its results (and collapsed)."""


def _settings_last(t: Table) -> bool:
    return t.title.split(": ", 1)[-1] in SETTINGS_TABLES


def section_blocks(body: Mapping[str, Any]) -> list[tuple[str, list[Table], list[str]]]:
    sections = body.get("sections") or {}
    names = [n for n in SECTION_ORDER if n in sections] + sorted(
        n for n in sections if n not in SECTION_ORDER
    )
    out = []
    for name in names:
        section = sections.get(name) or {}
        notes = [str(n) for n in section.get("notes") or []]
        tables = sorted(section_tables(name, section), key=_settings_last)
        out.append((name, tables, notes))
    return out


def render_html(body: Mapping[str, Any]) -> str:
    verdict = body.get("verdict") or {}
    timings = [(k, f"{v:.2f} s") for k, v in (body.get("timings") or {}).items()]
    return (
        _env()
        .get_template("report.html.j2")
        .render(
            deployment=body.get("deployment") or {"name": "?"},
            deployment_rows=deployment_rows(body.get("deployment") or {}),
            window=body.get("window") or {},
            generated_at=body.get("generated_at", ""),
            policy=body.get("policy") or {"name": "?", "notes": []},
            notes=body.get("notes") or [],
            decision=verdict.get("decision", "INCONCLUSIVE"),
            verdict=verdict,
            criteria=criteria_table(verdict),
            figures=figures(body),
            sections=section_blocks(body),
            measurements=measurement_rows(body.get("measurements") or []),
            timings=timings,
        )
    )
