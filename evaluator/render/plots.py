"""The review's figures, drawn with matplotlib (Agg, no display) and returned as SVG text to
inline in the HTML page (no files, no external assets).

Each function takes one section's JSON (as the analyses' ``to_dict()`` give it) and returns the
SVG, or None when the section holds no data for that figure. Figures are built on
:class:`matplotlib.figure.Figure` directly (not pyplot), so rendering is thread-safe and leaves
no global state behind.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.dates as mdates  # the backend is chosen first
from matplotlib.figure import Figure

ROLE_COLORS = {"incumbent": "#1f77b4", "candidate": "#d62728", "replay": "#7f7f7f"}
METRIC_LABELS = {
    "ttft": "TTFT (s)",
    "tpot": "TPOT (s)",
    "itl": "ITL (s)",
    "e2e": "E2E (s)",
    "tokens_per_s": "output tokens/s",
}
KIND_COLORS = {
    "crash": "#d62728",
    "hang": "#9467bd",
    "leak": "#ff7f0e",
    "error_burst": "#8c564b",
    "version_change": "#2ca02c",
}


def to_svg(fig: Figure) -> str:
    """The figure as an inline ``<svg>`` element (XML prolog and DOCTYPE removed)."""
    buf = io.StringIO()
    fig.savefig(
        buf,
        format="svg",
        bbox_inches="tight",
        metadata={"Date": None, "Creator": None, "Format": None, "Type": None},
    )
    text = buf.getvalue()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text


def _style() -> AbstractContextManager[None]:
    """Text kept as text in the SVG (smaller, searchable), a compact font size."""
    return matplotlib.rc_context({"svg.fonttype": "none", "font.size": 9})


def _numbers(values: Any) -> list[float]:
    if not isinstance(values, Sequence) or isinstance(values, str):
        return []
    out = []
    for v in values:
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def latency_cdfs(latency: Mapping[str, Any]) -> str | None:
    """Both engines' latency CDFs overlaid, one panel per metric (log x axis)."""
    cdf = (latency.get("plots") or {}).get("cdf") or {}
    metrics = [m for m in ("ttft", "tpot", "itl", "e2e") if cdf.get(m)]
    if not metrics:
        return None
    with _style():
        fig = Figure(figsize=(3.2 * len(metrics), 2.8))
        axes = fig.subplots(1, len(metrics), squeeze=False)[0]
        for ax, metric in zip(axes, metrics, strict=True):
            for role, series in cdf[metric].items():
                xs, ps = _numbers(series.get("values")), _numbers(series.get("probs"))
                if not xs or len(xs) != len(ps):
                    continue
                ax.plot(xs, ps, drawstyle="steps-post", label=role, color=ROLE_COLORS.get(role))
            if all(x > 0 for s in cdf[metric].values() for x in _numbers(s.get("values"))):
                ax.set_xscale("log")
            ax.set_xlabel(METRIC_LABELS.get(metric, metric))
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("share of requests ≤ x")
        axes[0].legend(loc="lower right")
        fig.suptitle("Latency CDFs, incumbent vs candidate")
        return to_svg(fig)


def weekly_p95(latency: Mapping[str, Any]) -> str | None:
    """The p95 of each metric per ISO week, both engines."""
    trend = (latency.get("plots") or {}).get("weekly_p95") or {}
    metrics = [m for m in ("ttft", "tpot", "e2e") if trend.get(m)]
    if not metrics:
        return None
    with _style():
        fig = Figure(figsize=(3.2 * len(metrics), 2.6))
        axes = fig.subplots(1, len(metrics), squeeze=False)[0]
        for ax, metric in zip(axes, metrics, strict=True):
            for role, series in trend[metric].items():
                weeks = [str(w) for w in series.get("weeks") or []]
                values = series.get("values") or []
                if not weeks or len(weeks) != len(values):
                    continue
                ys = [v if isinstance(v, int | float) else math.nan for v in values]
                ax.plot(weeks, ys, marker="o", label=role, color=ROLE_COLORS.get(role))
            ax.set_ylabel("p95 " + METRIC_LABELS.get(metric, metric))
            ax.tick_params(axis="x", labelrotation=45)
            ax.grid(alpha=0.3)
        axes[0].legend()
        fig.suptitle("Weekly p95")
        return to_svg(fig)


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def incident_timeline(incidents: Mapping[str, Any]) -> str | None:
    """One lane per engine, a bar (or a tick) per incident, coloured by kind."""
    timeline = incidents.get("timeline") or (incidents.get("plots") or {}).get("timeline") or []
    events = []
    for item in timeline:
        if not isinstance(item, Mapping):
            continue
        start = _when(item.get("started_at", item.get("start")))
        if start is None:
            continue
        end = _when(item.get("ended_at", item.get("end"))) or start
        lane = str(item.get("role") or item.get("engine") or "?")
        events.append((lane, str(item.get("kind", "?")), start, end))
    if not events:
        return None
    lanes = sorted({e[0] for e in events}, key=lambda r: (r != "incumbent", r))
    with _style():
        fig = Figure(figsize=(9, 0.6 + 0.5 * len(lanes)))
        ax = fig.subplots()
        seen: set[str] = set()
        for lane, kind, start, end in events:
            y = lanes.index(lane)
            color = KIND_COLORS.get(kind, "#333333")
            label = None if kind in seen else kind
            seen.add(kind)
            if end > start:
                width = (end - start).total_seconds() / 86400.0
                ax.barh(y, width, left=mdates.date2num(start), height=0.5, color=color, label=label)
            else:
                ax.plot(
                    [mdates.date2num(start)],
                    [y],
                    marker="|",
                    markersize=14,
                    color=color,
                    label=label,
                )
        ax.xaxis_date()
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(-0.7, len(lanes) - 0.3)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.autofmt_xdate()
        ax.set_title("Incidents")
        return to_svg(fig)


def _histograms(divergence: Mapping[str, Any]) -> tuple[list[float], dict[str, list[float]]]:
    hist = (divergence.get("plots") or {}).get("histogram") or divergence.get("histogram") or {}
    edges = _numbers(hist.get("edges") or hist.get("bins"))
    series: dict[str, list[float]] = {}
    for name, values in hist.items():
        if name in ("edges", "bins", "metric", "title", "xlabel"):
            continue
        counts = values.get("counts") if isinstance(values, Mapping) else values
        nums = _numbers(counts)
        if edges and len(nums) == len(edges) - 1:
            series[str(name)] = nums
    return edges, series


def divergence_histogram(divergence: Mapping[str, Any]) -> str | None:
    """Edit similarity to the incumbent: candidate pairs vs replay pairs (the noise floor)."""
    edges, series = _histograms(divergence)
    if not series:
        return None
    hist = (divergence.get("plots") or {}).get("histogram") or divergence.get("histogram") or {}
    with _style():
        fig = Figure(figsize=(6, 2.8))
        ax = fig.subplots()
        for name, counts in series.items():
            total = sum(counts) or 1.0
            shares = [c / total for c in counts]
            ax.stairs(
                shares,
                edges,
                label=f"{name} (n={total:.0f})",
                color=ROLE_COLORS.get(name),
                fill=name == "replay",
                alpha=0.6,
            )
        ax.set_xlabel(str(hist.get("xlabel") or "edit similarity to the incumbent"))
        ax.set_ylabel("share of pairs")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
        ax.set_title(str(hist.get("title") or "Output divergence"))
        return to_svg(fig)


def figures(body: Mapping[str, Any]) -> dict[str, str]:
    """Every figure the review's sections have data for, by name, as SVG."""
    sections = body.get("sections") or {}
    out: dict[str, str | None] = {
        "latency_cdf": latency_cdfs(sections.get("latency") or {}),
        "weekly_p95": weekly_p95(sections.get("latency") or {}),
        "incident_timeline": incident_timeline(sections.get("incidents") or {}),
        "divergence_histogram": divergence_histogram(sections.get("divergence") or {}),
    }
    return {k: v for k, v in out.items() if v}
