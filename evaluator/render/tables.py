"""Tables from the sections' JSON: nested rows flattened into columns, numbers formatted.

Pure functions on plain values, shared by the HTML and Markdown renderers so both show the same
cells. A section's table is any top-level list of mappings (``by_day``, ``by_week``,
``by_load``, ...); nested mappings become dotted columns (``candidate.p95``), an interval
``{value, low, high}`` one cell ``1.02 [0.98, 1.07]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evaluator.sequential import level_text

MAX_ROWS = 400
"""Longer tables are cut (with a note) so a month-long report stays readable."""


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""


def number(value: Any) -> str:
    """A cell: 4 significant digits for floats, as-is for the rest."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3e}"
        return f"{value:.4g}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) > 8:
            return f"[{len(value)} values]"
        return ", ".join(number(v) for v in value)
    return str(value)


def is_interval(value: Any) -> bool:
    return isinstance(value, Mapping) and {"low", "high"} <= set(value) and len(value) <= 4


def level_cell(level: Any) -> str:
    """A confidence level for people: 95 %, 99.38 %, or 1 - 2.0e-09 when very close to 1."""
    return level_text(float(level)) if isinstance(level, int | float) else ""


def interval_cell(value: Mapping[str, Any]) -> str:
    v = value.get("value")
    span = f"[{number(value.get('low'))}, {number(value.get('high'))}]"
    return f"{number(v)} {span}" if "value" in value else span


def flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; intervals kept whole (rendered as one cell)."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and not is_interval(value):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def cell(value: Any) -> str:
    return interval_cell(value) if is_interval(value) else number(value)


def make_table(title: str, rows: Sequence[Mapping[str, Any]], max_rows: int = MAX_ROWS) -> Table:
    flat = [flatten(r) for r in rows]
    columns: list[str] = []
    for r in flat:
        for k in r:
            if k not in columns:
                columns.append(k)
    shown = flat[:max_rows]
    note = f"first {max_rows} of {len(flat)} rows" if len(flat) > max_rows else ""
    return Table(title, columns, [[cell(r.get(c)) for c in columns] for r in shown], note)


def is_table(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


SKIP_KEYS = frozenset({"measurements", "plots", "notes", "window", "deployment", "detail"})
"""Section keys that are not tables (shown elsewhere or not at all)."""


def section_tables(name: str, section: Mapping[str, Any]) -> list[Table]:
    """Every table of one section: its lists of rows, and its flat mappings as key/value."""
    out: list[Table] = []
    for key, value in section.items():
        if key in SKIP_KEYS:
            continue
        title = f"{name}: {key.replace('_', ' ')}"
        if is_table(value):
            out.append(make_table(title, value))
        elif isinstance(value, Mapping) and value:
            flat = flatten(value)
            if all(not isinstance(v, list) or len(v) <= 8 for v in flat.values()):
                rows = [{"field": k, "value": v} for k, v in flat.items()]
                out.append(make_table(title, rows))
    return out


def measurement_rows(measurements: Sequence[Mapping[str, Any]]) -> Table:
    rows = []
    for m in measurements:
        iv = m.get("interval")
        rows.append(
            {
                "key": m.get("key"),
                "value": m.get("value"),
                "interval": interval_cell(iv) if iv else "",
                "n": m.get("n"),
                "unit": m.get("unit"),
                "detail": m.get("detail", ""),
            }
        )
    return make_table("measurements", rows)


def criteria_table(verdict: Mapping[str, Any]) -> Table:
    rows = []
    for r in [*verdict.get("criteria", []), *verdict.get("data_checks", [])]:
        m = r.get("measurement") or {}
        iv = m.get("interval")
        rows.append(
            {
                "outcome": r.get("outcome"),
                "criterion": r.get("criterion", {}).get("text"),
                "value": number(m.get("value")) if m else "",
                "interval": interval_cell(iv) if iv else "",
                "level": level_cell(iv.get("level")) if iv else "",
                "n": m.get("n") if m else "",
                "reason": r.get("reason"),
            }
        )
    return make_table("criteria", rows)
