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
from matplotlib.ticker import NullFormatter

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
                # A range under a decade would label every minor tick, on top of each other.
                ax.xaxis.set_minor_formatter(NullFormatter())
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


def _num(v: Any) -> float:
    """A finite number, else NaN (a gap in a plotted line)."""
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return math.nan


def latency_vs_concurrency(latency: Mapping[str, Any]) -> str | None:
    """p95 of TTFT and E2E per load bucket (requests in flight at the incumbent at dispatch),
    both engines, and the candidate/incumbent p95 ratio with its interval."""
    curve = latency.get("by_concurrency") or []
    metrics = [m for m in ("ttft", "e2e") if any(r.get("metric") == m for r in curve)]
    if not metrics:
        return None
    with _style():
        fig = Figure(figsize=(3.4 * len(metrics), 4.6))
        axes = fig.subplots(2, len(metrics), squeeze=False)
        for j, metric in enumerate(metrics):
            rows = [r for r in curve if r.get("metric") == metric]
            xs = [str(r.get("bucket")) for r in rows]
            top, bottom = axes[0][j], axes[1][j]
            for role in ("incumbent", "candidate"):
                ys = [_num((r.get(role) or {}).get("p95")) for r in rows]
                top.plot(xs, ys, marker="o", label=role, color=ROLE_COLORS.get(role))
            ratio = [(r.get("ratio") or {}).get("p95") or {} for r in rows]
            value = [_num(q.get("value")) for q in ratio]
            low = [_num(q.get("low")) for q in ratio]
            high = [_num(q.get("high")) for q in ratio]
            err = [
                [
                    max(0.0, v - lo) if math.isfinite(v - lo) else 0.0
                    for v, lo in zip(value, low, strict=True)
                ],
                [
                    max(0.0, hi - v) if math.isfinite(hi - v) else 0.0
                    for v, hi in zip(value, high, strict=True)
                ],
            ]
            bottom.errorbar(xs, value, yerr=err, fmt="o-", capsize=3, color="black")
            bottom.axhline(1.0, color="grey", linewidth=0.8)
            top.set_ylabel("p95 " + METRIC_LABELS.get(metric, metric))
            bottom.set_ylabel("p95 ratio, candidate / incumbent")
            bottom.set_xlabel("requests in flight at dispatch")
            for ax in (top, bottom):
                ax.tick_params(axis="x", labelrotation=45)
                ax.grid(alpha=0.3)
        axes[0][0].legend()
        fig.suptitle("Latency against concurrency (ratio intervals: pair bootstrap per bucket)")
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
        window = incidents.get("window") or {}
        lo, hi = _when(window.get("from")), _when(window.get("to"))
        if lo is not None and hi is not None and hi > lo:
            # The whole reviewed window, so quiet stretches show as well as incidents.
            ax.set_xlim(mdates.date2num(lo), mdates.date2num(hi))
        locator = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(-0.7, len(lanes) - 0.3)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.set_title("Incidents (UTC)")
        return to_svg(fig)


HISTOGRAM_LABELS = {
    "edit_similarity": "edit similarity to the incumbent",
    "first_divergence": "first divergence position (tokens)",
    "similarity": "embedding cosine similarity to the incumbent",
}


def _histogram_series(hist: Mapping[str, Any]) -> tuple[list[float], dict[str, list[float]]]:
    """(edges, {series: counts}); an open last edge (null) is drawn as twice the one before."""
    raw_edges = hist.get("edges") or hist.get("bins") or []
    edges: list[float] = []
    for e in raw_edges:
        if isinstance(e, int | float) and not isinstance(e, bool) and math.isfinite(e):
            edges.append(float(e))
        elif edges and e is raw_edges[-1]:
            edges.append(edges[-1] * 2 if edges[-1] > 0 else edges[-1] + 1)
    series: dict[str, list[float]] = {}
    for name, values in hist.items():
        counts = values.get("counts") if isinstance(values, Mapping) else values
        nums = _numbers(counts)
        if name not in ("edges", "bins") and edges and len(nums) == len(edges) - 1:
            series[str(name)] = nums
    return edges, series


def _histograms(divergence: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The section's histograms by name: ``histograms: {name: {edges, candidate, replay}}``
    (or a single ``plots.histogram``)."""
    many = divergence.get("histograms")
    if isinstance(many, Mapping) and many:
        return {str(k): v for k, v in many.items() if isinstance(v, Mapping)}
    one = (divergence.get("plots") or {}).get("histogram") or divergence.get("histogram")
    return {"edit_similarity": one} if isinstance(one, Mapping) else {}


DIVERGENCE_TITLE = "Output divergence: candidate vs the incumbent's own noise (replay)"
SEMANTIC_TITLE = "Semantic similarity: candidate vs the incumbent's own replay (the floor)"


def divergence_histogram(
    divergence: Mapping[str, Any], title: str = DIVERGENCE_TITLE
) -> str | None:
    """Candidate pairs vs replay pairs (the noise floor): edit similarity to the incumbent and
    the first divergence position (or, for the semantic section, the embedding similarity), as
    shares of each side's pairs."""
    panels = []
    for name, hist in _histograms(divergence).items():
        edges, series = _histogram_series(hist)
        if series and any(sum(c) > 0 for c in series.values()):
            panels.append((name, edges, series))
    if not panels:
        return None
    with _style():
        fig = Figure(figsize=(4.5 * len(panels), 2.8))
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, (name, edges, series) in zip(axes, panels, strict=True):
            for side, counts in series.items():
                total = sum(counts)
                if total <= 0:
                    continue
                ax.stairs(
                    [c / total for c in counts],
                    edges,
                    label=f"{side} (n={total:.0f})",
                    color=ROLE_COLORS.get(side),
                    fill=side == "replay",
                    alpha=0.6 if side == "replay" else 1.0,
                )
            if name == "first_divergence" and edges and edges[0] >= 0:
                ax.set_xscale("symlog", linthresh=1)
            ax.set_xlabel(HISTOGRAM_LABELS.get(name, name.replace("_", " ")))
            ax.set_ylabel("share of pairs")
            ax.grid(alpha=0.3)
            ax.legend(loc="upper left")
        fig.suptitle(title)
        return to_svg(fig)


def figures(body: Mapping[str, Any]) -> dict[str, str]:
    """Every figure the review's sections have data for, by name, as SVG."""
    sections = body.get("sections") or {}
    out: dict[str, str | None] = {
        "latency_cdf": latency_cdfs(sections.get("latency") or {}),
        "weekly_p95": weekly_p95(sections.get("latency") or {}),
        "latency_vs_concurrency": latency_vs_concurrency(sections.get("latency") or {}),
        "incident_timeline": incident_timeline(sections.get("incidents") or {}),
        "divergence_histogram": divergence_histogram(sections.get("divergence") or {}),
        "semantic_histogram": divergence_histogram(sections.get("semantic") or {}, SEMANTIC_TITLE),
    }
    return {k: v for k, v in out.items() if v}
