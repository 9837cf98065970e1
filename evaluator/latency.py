"""Is the candidate faster? The latency section of the review.

:func:`analyze_latency` compares the candidate with the incumbent on TTFT, TPOT, ITL, E2E and
output tokens/s (timing definitions as vLLM's benchmark, see docs/architecture.md, "Timing
definitions"), over one deployment and window:

- quantiles p50/p95/p99 per role come from the hourly rollup sketches
  (:mod:`evaluator.rollups`, ~1 % relative accuracy), merged over the whole window, per UTC day,
  per ISO week and per load / prompt-length / output-length bucket, so a 30-day report never
  rescans the raw rows;
- ratios candidate/incumbent of each quantile, paired median deltas, the paired Wilcoxon
  signed-rank test, the spread ratio (p99 - p50) and goodput come from a bounded random sample of
  pairs (both roles ``ok``) that the rollups draw in SQL, with bootstrap intervals
  (:mod:`evaluator.stats`);
- only ``status = 'ok'`` exchanges count; exchanges sent during a :class:`WarmupWindow` (an
  engine (re)start, built by B2's ``evaluator.incidents.restarts.warmup_windows``) are left
  out, and the first requests after each restart are reported separately as cold-start times.

Errors: :class:`~evaluator.errors.LatencyError` (bad arguments, such as a naive or empty
window). Database errors are SQLAlchemy's, as the store raises them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from sqlalchemy import Engine

from evaluator.blocks import METHOD as BLOCK_METHOD
from evaluator.blocks import MIN_HOURS, Blocks, blocks_from_hours
from evaluator.errors import LatencyError
from evaluator.parity import ParityConfig, load_parity, parity_reason
from evaluator.rates import wilson_interval
from evaluator.results import Interval, Measurement, Progress, Window
from evaluator.rollups import (
    SLICES,
    SketchColumns,
    SketchRow,
    bucket_labels,
    load_itl,
    load_raw_sketches,
    load_sample,
    load_sketch_columns,
    load_stored_sketches,
    merge_intervals,
    raw_role_rows,
    refresh_rollups,
)
from evaluator.sketch import RELATIVE_ACCURACY, LogSketch
from evaluator.stats import (
    BootstrapConfig,
    Estimate,
    PairedComparison,
    goodput_mask,
    paired_comparison,
    pooled_comparison,
    share_delta,
    subsample,
)

T = TypeVar("T")
METRICS = ("ttft", "tpot", "itl", "e2e", "tokens_per_s")
"""Metric names as in the measurement keys (evaluator/results.py)."""
QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
ROLES = ("incumbent", "candidate")


@dataclass(frozen=True)
class WarmupWindow:
    """An engine warming up after a (re)start: ``role``'s exchanges sent in [start, end) are left
    out of the comparison and reported as cold-start time instead."""

    role: str
    start: datetime
    end: datetime


@dataclass(frozen=True)
class VersionChange:
    """An engine's version change at ``at`` (from the incidents): latency is compared in the
    spans just before and just after it."""

    role: str
    at: datetime
    from_version: str | None = None
    to_version: str | None = None


@dataclass(frozen=True)
class SLO:
    """Service-level objectives for goodput, as vLLM's benchmark ``--goodput ttft:..,tpot:..``:
    a request is good when it completed and every configured metric is <= its objective
    (seconds; None = not judged). TPOT of a one-token answer counts as 0, as vLLM does."""

    ttft_s: float | None = 0.5
    tpot_s: float | None = 0.05
    e2e_s: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s}


@dataclass(frozen=True)
class LatencySection:
    """The latency comparison of one deployment over one window.

    ``to_dict()`` (JSON-able) holds::

        deployment, window {from, to}, slo, method (sketch accuracy, sample sizes, resamples),
        n {incumbent, candidate, pairs, pairs_sampled, warmup_excluded {role: count}},
        measurements  [Measurement.to_dict(), ...]
        overall       [{metric, role: {p50,p95,p99,n,mean}, ratio: {p50: {value, low, high}, ..},
                        median_delta {value, low, high}, spread_ratio {..}, rank_test_p}, ...]
        by_day        [{day: "YYYY-MM-DD", metric, incumbent {p50,p95,p99,n}, candidate {..},
                        ratio {p50,p95,p99}}, ...]
        by_week       same with week: "YYYY-Www"
        by_load, by_prompt_length, by_output_length
                      same with bucket: "lo-hi" (load = inflight_incumbent at dispatch)
        goodput       {slo, incumbent {good, n, share}, candidate {..}, delta {value,low,high}}
        cold_start    [{role, start, first_ttft_s [..], median_first_ttft_s, time_to_normal_s,
                        steady_ttft_p50_s}, ...]
        plots         {cdf: {metric: {role: {values: [..], probs: [..]}}},
                       weekly_p95: {metric: {role: {weeks: [..], values: [..]}}}}
        notes         [sentences: what was left out, how intervals were computed]
    """

    deployment: str
    window: Window
    slo: SLO
    measurement_list: tuple[Measurement, ...] = ()
    tables: dict[str, Any] = field(default_factory=dict)
    """overall, by_day, by_week, by_load, by_prompt_length, by_output_length, goodput,
    cold_start, n, method (see the class docstring)."""
    plots: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def measurements(self) -> list[Measurement]:
        return list(self.measurement_list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "window": {"from": self.window[0].isoformat(), "to": self.window[1].isoformat()},
            "slo": self.slo.to_dict(),
            "measurements": [m.to_dict() for m in self.measurement_list],
            **self.tables,
            "plots": self.plots,
            "notes": list(self.notes),
        }


# --- assembling the section ------------------------------------------------------------------

DEFAULT_BOOTSTRAP = BootstrapConfig()
DEFAULT_PARITY = ParityConfig()
COLD_LOOKAHEAD = timedelta(minutes=10)
"""How far after a restart the cold-start look goes (at least the warm-up window itself)."""
COLD_FIRST = 5
"""How many first requests after a restart are listed, and the rolling-median width."""
NORMAL_FACTOR = 1.25
"""Latency is back to normal when the rolling median TTFT is within this factor of the role's
steady-state p50 TTFT."""
UNITS = {
    "ttft": "seconds",
    "tpot": "seconds",
    "itl": "seconds",
    "e2e": "seconds",
    "tokens_per_s": "tokens/s",
}
_SAMPLE_COLUMN = {
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "e2e": "e2e_s",
    "tokens_per_s": "tokens_per_s",
    "itl": "itl_mean_s",
}


def _in_background(engine: Engine, fn: Callable[..., T], *args: Any) -> Callable[[], T]:
    """``fn(*args)`` started in a thread of its own on PostgreSQL (the server reads while this
    process computes; the thread takes its own pooled connection); call the returned function
    for its result (its error, if it failed). Elsewhere (SQLite) it runs when asked."""
    if engine.dialect.name != "postgresql":
        return lambda: fn(*args)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shadow-ab-latency")
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)  # the thread ends with its one task
    return future.result


def _check(window: Window, warmup: Sequence[WarmupWindow]) -> tuple[datetime, datetime]:
    lo, hi = window
    if lo.tzinfo is None or hi.tzinfo is None:
        raise LatencyError("window bounds must be timezone-aware (UTC)")
    if hi <= lo:
        raise LatencyError(f"empty window: {lo.isoformat()} .. {hi.isoformat()}")
    for w in warmup:
        if w.role not in ("incumbent", "candidate", "replay"):
            raise LatencyError(f"warm-up window of unknown role {w.role!r}")
        if w.start.tzinfo is None or w.end.tzinfo is None:
            raise LatencyError("warm-up windows must be timezone-aware (UTC)")
    return lo.astimezone(UTC), hi.astimezone(UTC)


def _iso_week(ts: datetime) -> str:
    year, week, _ = ts.isocalendar()
    return f"{year}-W{week:02d}"


SketchKey = tuple[str, str, str, str, str]
"""(period kind "all"/"day"/"week", period, role, metric, slice)."""

DENSE_BINS = 20_000_000
"""Largest (row groups x bucket range) merged in one dense count table; wider ranges are
merged by sorting the buckets instead."""


def group_sketches(rows: Sequence[SketchRow] | SketchColumns) -> dict[SketchKey, LogSketch]:
    """Merge sketch rows (subtracting sign -1 rows) into whole-window sketches per slice and
    per-day / per-ISO-week sketches of slice ``all``.

    Vectorized (a month is ~100 k rows, ~10 M buckets): the buckets are counted per row group
    (its day, role, metric and slice) in one count table, whose rows add up to each sketch's
    (days to windows and weeks: integer counts, exact); each sketch's sum is added over its
    rows in row order (the same floating-point sum as adding them one by one), min and max
    over the positive rows that have them."""
    cols = rows if isinstance(rows, SketchColumns) else SketchColumns.from_rows(rows)
    index: dict[SketchKey, int] = {}  # the sketches, in order of first appearance
    base_index: dict[tuple[str, str, str, str], int] = {}  # (day, role, metric, slice)
    base_groups: list[list[int]] = []  # each row group's sketches
    periods: dict[datetime, tuple[str, str]] = {}
    row_base: list[int] = []
    for hour, role, metric, sl in zip(cols.hour, cols.role, cols.metric, cols.slice, strict=True):
        day_week = periods.get(hour)
        if day_week is None:
            day_week = periods[hour] = (hour.date().isoformat(), _iso_week(hour))
        base = base_index.get((day_week[0], role, metric, sl))
        if base is None:
            keys: list[SketchKey] = [("all", "", role, metric, sl)]
            if sl == "all":
                keys.append(("day", day_week[0], role, metric, "all"))
                keys.append(("week", day_week[1], role, metric, "all"))
            base = base_index[(day_week[0], role, metric, sl)] = len(base_groups)
            base_groups.append([index.setdefault(k, len(index)) for k in keys])
        row_base.append(base)
    n_groups = len(index)
    if n_groups == 0:
        return {}
    # (row, sketch) memberships in row order, for the order-dependent sum and the min / max
    base_of_row = np.array(row_base, dtype=np.intp)
    fan = np.array([len(g) for g in base_groups], dtype=np.intp)
    member_row = np.repeat(np.arange(len(cols)), fan[base_of_row])
    member_group = np.array([g for b in row_base for g in base_groups[b]], dtype=np.intp)
    sign = cols.sign[member_row]
    # bincount adds its weights one by one in order: each sketch's sum in row order
    total = np.bincount(member_group, weights=sign * cols.sum[member_row], minlength=n_groups)
    zero = np.bincount(member_group, weights=sign * cols.zero_count[member_row], minlength=n_groups)
    usable = (sign > 0) & ~np.isnan(cols.min[member_row]) & ~np.isnan(cols.max[member_row])
    lo = np.full(n_groups, math.inf)
    hi = np.full(n_groups, -math.inf)
    np.minimum.at(lo, member_group[usable], cols.min[member_row[usable]])
    np.maximum.at(hi, member_group[usable], cols.max[member_row[usable]])
    merged = _merge_buckets(cols, base_of_row, base_groups, n_groups)
    out: dict[SketchKey, LogSketch] = {}
    for k, g in index.items():
        has_range = lo[g] <= hi[g]
        out[k] = LogSketch(
            RELATIVE_ACCURACY,
            merged[g][0],
            merged[g][1],
            zero_count=int(zero[g]),
            sum=float(total[g]),
            min=float(lo[g]) if has_range else math.inf,
            max=float(hi[g]) if has_range else -math.inf,
        )
    return out


def _merge_buckets(
    cols: SketchColumns,
    base_of_row: npt.NDArray[np.intp],
    base_groups: list[list[int]],
    n_groups: int,
) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
    """Each sketch's (sorted bucket keys, their nonzero summed counts): the rows' buckets
    counted per row group, the row groups added into their sketches."""
    empty = (np.empty(0, np.int64), np.empty(0, np.int64))
    if cols.keys.size == 0:
        return [empty] * n_groups
    item_base = np.repeat(base_of_row, cols.lengths)
    counts = cols.counts * np.repeat(cols.sign, cols.lengths)
    kmin, kmax = int(cols.keys.min()), int(cols.keys.max())
    width = kmax - kmin + 1
    n_base = len(base_groups)
    out: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
    if n_base * width <= DENSE_BINS:
        # integer counts in float64: exact sums (far below 2**53)
        base_table = np.bincount(
            item_base * width + (cols.keys - kmin), weights=counts, minlength=n_base * width
        ).reshape(n_base, width)
        table = np.zeros((n_groups, width))
        for b, groups in enumerate(base_groups):
            table[groups] += base_table[b]
        for g in range(n_groups):
            nz = np.flatnonzero(table[g])
            out.append(((nz + kmin).astype(np.int64), table[g, nz].astype(np.int64)))
        return out
    # a very wide bucket range: sort (sketch, key) pairs instead of a dense table
    fan = np.array([len(g) for g in base_groups], dtype=np.intp)
    flat_groups = np.array([g for gs in base_groups for g in gs], dtype=np.intp)
    first = np.cumsum(fan) - fan
    reps = fan[item_base]
    item = np.repeat(np.arange(item_base.size), reps)
    within = np.arange(item.size) - np.repeat(np.cumsum(reps) - reps, reps)
    group = flat_groups[first[item_base[item]] + within]
    key, cnt = cols.keys[item], counts[item]
    order = np.lexsort((key, group))
    group, key, cnt = group[order], key[order], cnt[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = (group[1:] != group[:-1]) | (key[1:] != key[:-1])
    starts = np.flatnonzero(new)
    summed = np.add.reduceat(cnt.astype(np.float64), starts).astype(np.int64)
    keep = summed != 0
    group, key, summed = group[starts][keep], key[starts][keep], summed[keep]
    bounds = np.searchsorted(group, np.arange(n_groups + 1))
    return [
        (key[bounds[g] : bounds[g + 1]], summed[bounds[g] : bounds[g + 1]]) for g in range(n_groups)
    ]


def _qs(sk: LogSketch | None) -> dict[str, float | None]:
    out: dict[str, float | None] = {"n": sk.count if sk else 0}
    values = sk.quantiles(list(QUANTILES.values())) if sk else [math.nan] * len(QUANTILES)
    for name, v in zip(QUANTILES, values, strict=True):
        out[name] = None if math.isnan(v) else v
    out["mean"] = None if sk is None or math.isnan(sk.mean) else sk.mean
    return out


def _ratio_cells(inc: dict[str, float | None], cand: dict[str, float | None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in QUANTILES:
        a, b = inc.get(name), cand.get(name)
        out[name] = b / a if a and b is not None else None
    return out


def _period_table(
    sketches: dict[SketchKey, LogSketch], kind: str, label: str
) -> list[dict[str, Any]]:
    periods = sorted({k[1] for k in sketches if k[0] == kind})
    table = []
    for period in periods:
        for metric in METRICS:
            inc = _qs(sketches.get((kind, period, "incumbent", metric, "all")))
            cand = _qs(sketches.get((kind, period, "candidate", metric, "all")))
            if not inc["n"] and not cand["n"]:
                continue
            table.append(
                {
                    label: period,
                    "metric": metric,
                    "incumbent": inc,
                    "candidate": cand,
                    "ratio": _ratio_cells(inc, cand),
                }
            )
    return table


def _bucket_table(sketches: dict[SketchKey, LogSketch], dim: str) -> list[dict[str, Any]]:
    labels = bucket_labels(SLICES[dim][1])
    table = []
    for i, bucket in enumerate(labels):
        for metric in METRICS:
            inc = _qs(sketches.get(("all", "", "incumbent", metric, f"{dim}:{i}")))
            cand = _qs(sketches.get(("all", "", "candidate", metric, f"{dim}:{i}")))
            if not inc["n"] and not cand["n"]:
                continue
            table.append(
                {
                    "bucket": bucket,
                    "metric": metric,
                    "incumbent": inc,
                    "candidate": cand,
                    "ratio": _ratio_cells(inc, cand),
                }
            )
    return table


def _in_any(ts: Sequence[datetime], spans: Sequence[tuple[datetime, datetime]]) -> np.ndarray:
    mask = np.zeros(len(ts), dtype=bool)
    if not spans:
        return mask
    for i, t in enumerate(ts):
        mask[i] = any(a <= t < b for a, b in spans)
    return mask


def _floats(values: Sequence[Any]) -> npt.NDArray[np.float64]:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


def _cold_start(
    engine: Engine,
    deployment: str,
    warmup: Sequence[WarmupWindow],
    window: tuple[datetime, datetime],
    steady: dict[str, float],
) -> list[dict[str, Any]]:
    out = []
    for w in sorted(warmup, key=lambda w: (w.start, w.role)):
        start = w.start.astimezone(UTC)
        if not (window[0] <= start < window[1]):
            continue
        end = start + max(w.end - w.start, COLD_LOOKAHEAD)
        rows = raw_role_rows(engine, deployment, w.role, start, min(end, window[1]))
        firsts = [t if t is not None else e for _, t, e in rows]
        ttfts = [v for v in firsts if v is not None]
        entry: dict[str, Any] = {
            "role": w.role,
            "start": start.isoformat(),
            "warmup_end": w.end.astimezone(UTC).isoformat(),
            "first_ttft_s": ttfts[:COLD_FIRST],
            "median_first_ttft_s": float(np.median(ttfts[:COLD_FIRST])) if ttfts else None,
            "steady_ttft_p50_s": steady.get(w.role),
            "time_to_normal_s": None,
        }
        normal = steady.get(w.role)
        if normal is not None and len(rows) >= COLD_FIRST:
            vals = np.array([np.nan if v is None else v for v in firsts], dtype=np.float64)
            for i in range(len(vals) - COLD_FIRST + 1):
                window_vals = vals[i : i + COLD_FIRST]
                window_vals = window_vals[np.isfinite(window_vals)]
                if window_vals.size and np.median(window_vals) <= NORMAL_FACTOR * normal:
                    entry["time_to_normal_s"] = (rows[i][0] - start).total_seconds()
                    break
        out.append(entry)
    return out


UPGRADE_METRICS = ("ttft", "tpot", "e2e")


def _upgrade_latency(
    engine: Engine,
    deployment: str,
    window: tuple[datetime, datetime],
    changes: Sequence[VersionChange],
    exclude: dict[str, list[tuple[datetime, datetime]]],
) -> list[dict[str, Any]]:
    """Per version change, both roles' p50/p95/p99 (from the sketches, warm-ups left out) in the
    span just before it (from the role's previous change or the window's start) and just after
    it (to its next change or the window's end), and the candidate/incumbent ratios in each."""
    lo, hi = window
    out = []
    for c in sorted(changes, key=lambda c: c.at):
        at = c.at.astimezone(UTC)
        if not lo < at < hi:
            continue
        same = sorted(x.at.astimezone(UTC) for x in changes if x.role == c.role)
        prev = max([t for t in same if t < at], default=lo)
        nxt = min([t for t in same if t > at], default=hi)
        row: dict[str, Any] = {
            "role": c.role,
            "at": at.isoformat(),
            "from_version": c.from_version,
            "to_version": c.to_version,
        }
        for side, span in (("before", (max(prev, lo), at)), ("after", (at, min(nxt, hi)))):
            sketches = group_sketches(
                load_sketch_columns(engine, deployment, span, exclude=exclude)
            )
            cells = []
            for metric in UPGRADE_METRICS:
                inc = _qs(sketches.get(("all", "", "incumbent", metric, "all")))
                cand = _qs(sketches.get(("all", "", "candidate", metric, "all")))
                cells.append(
                    {
                        "metric": metric,
                        "incumbent": inc,
                        "candidate": cand,
                        "ratio": _ratio_cells(inc, cand),
                    }
                )
            row[side] = {"from": span[0].isoformat(), "to": span[1].isoformat(), "metrics": cells}
        out.append(row)
    return out


CURVE_METRICS = ("ttft", "tpot", "e2e")
CURVE_MIN_PAIRS = 20


def _concurrency_curve(
    cols: dict[str, list[Any]], keep: npt.NDArray[np.bool_], config: BootstrapConfig
) -> list[dict[str, Any]]:
    """Latency against concurrency: per load bucket (``inflight_incumbent`` at dispatch) of the
    sampled pairs (both ok, outside warm-up), each role's p50/p95 and the p50/p95 ratios with
    pair-bootstrap intervals (buckets of at least ``CURVE_MIN_PAIRS`` pairs)."""
    labels = bucket_labels(SLICES["load"][1])
    edges = np.array(SLICES["load"][1])
    inflight = _floats(cols["inflight_incumbent"])
    bucket = np.where(np.isfinite(inflight), np.searchsorted(edges, inflight, side="right"), -1)
    small = replace(config, n_resamples=min(config.n_resamples, 199))
    values = {  # each column converted once, not once per bucket
        f"{role}_{_SAMPLE_COLUMN[m]}": _floats(cols[f"{role}_{_SAMPLE_COLUMN[m]}"])
        for m in CURVE_METRICS
        for role in ROLES
    }
    out = []
    for i, label in enumerate(labels):
        mask = keep & (bucket == i)
        n = int(mask.sum())
        if n < CURVE_MIN_PAIRS:
            continue
        for metric in CURVE_METRICS:
            column = _SAMPLE_COLUMN[metric]
            a = values[f"incumbent_{column}"][mask]
            b = values[f"candidate_{column}"][mask]
            comp = paired_comparison(a, b, small)
            qa = np.nanquantile(a, [0.5, 0.95]) if np.isfinite(a).any() else [math.nan] * 2
            qb = np.nanquantile(b, [0.5, 0.95]) if np.isfinite(b).any() else [math.nan] * 2
            out.append(
                {
                    "bucket": label,
                    "metric": metric,
                    "n": comp.n,
                    "incumbent": {"p50": float(qa[0]), "p95": float(qa[1])},
                    "candidate": {"p50": float(qb[0]), "p95": float(qb[1])},
                    "ratio": {q: comp.ratios[q].to_dict() for q in ("p50", "p95")},
                }
            )
    return out


CENSORED_METRICS = ("ttft", "e2e")
"""Metrics whose quantiles are also given with failures counted as slowest."""


def _with_failures(
    cols: dict[str, list[Any]],
    keep: npt.NDArray[np.bool_],
    hours: Sequence[datetime],
    config: BootstrapConfig,
    timeout_s: float,
) -> tuple[list[Measurement], list[dict[str, Any]]]:
    """``latency.<metric>.<q>.ratio_with_failures``: the quantile ratios over every sampled pair
    (outside warm-up, neither side cancelled), a failed answer counted as the slowest (at the
    shadow timeout) and both roles censored there (the mirror cuts the candidate at the
    timeout, never the incumbent): a candidate that times out does not look faster by losing
    its slowest requests."""
    status = {r: np.array(cols[f"{r}_status"], dtype=object) for r in ROLES}
    use = keep & (status["incumbent"] != "cancelled") & (status["candidate"] != "cancelled")
    blocks = _blocks(hours, use, config)
    out: list[Measurement] = []
    table: list[dict[str, Any]] = []
    for metric in CENSORED_METRICS:
        column = _SAMPLE_COLUMN[metric]
        values = {}
        for r in ROLES:
            v = _floats(cols[f"{r}_{column}"])
            v = np.where((status[r] == "ok") & np.isfinite(v), v, timeout_s)
            values[r] = np.minimum(v, timeout_s)[use]
        comp = paired_comparison(values["incumbent"], values["candidate"], config, blocks=blocks)
        failed = {r: int(np.sum(status[r][use] != "ok")) for r in ROLES}
        detail = (
            f"{comp.n} sampled pairs, failures counted as the slowest (candidate"
            f" {failed['candidate']}, incumbent {failed['incumbent']}) and both roles censored"
            f" at the {timeout_s:g} s shadow timeout; "
            + ("block" if blocks is not None else "pair")
            + " bootstrap"
        )
        for q in QUANTILES:
            out.append(
                _measurement(
                    f"latency.{metric}.{q}.ratio_with_failures",
                    comp.ratios[q],
                    "ratio",
                    detail,
                    level=config.level,
                )
            )
        table.append(
            {
                "metric": metric,
                "failed": failed,
                "timeout_s": timeout_s,
                "ratio": {q: comp.ratios[q].to_dict() for q in QUANTILES},
            }
        )
    return out, table


def _blocks(
    hours: Sequence[datetime], mask: npt.NDArray[np.bool_], config: BootstrapConfig
) -> Blocks | None:
    """The hour/day blocks of the sampled pairs in ``mask`` (None when the config resamples
    pairs one by one)."""
    if config.unit == "pairs":
        return None
    if config.unit != "blocks":
        raise LatencyError(f"bootstrap unit must be 'blocks' or 'pairs', got {config.unit!r}")
    blocks = blocks_from_hours([h for h, k in zip(hours, mask, strict=True) if k])
    return blocks if blocks.n_hours >= MIN_HOURS else None


def _steady_from_sample(cols: dict[str, list[Any]]) -> dict[str, float]:
    """Each role's median TTFT over the sampled ok pairs (the "normal" a warm-up ends at)."""
    out = {}
    for role in ROLES:
        ok = np.array([st == "ok" for st in cols[f"{role}_status"]], dtype=bool)
        v = _floats(cols[f"{role}_ttft_s"])[ok]
        v = v[np.isfinite(v)]
        if v.size:
            out[role] = float(np.median(v))
    return out


def _until_normal(
    engine: Engine,
    deployment: str,
    warmup: Sequence[WarmupWindow],
    window: tuple[datetime, datetime],
    steady: dict[str, float],
) -> list[WarmupWindow]:
    """Each warm-up window stretched to when latency was measured back to normal: the rolling
    median of ``COLD_FIRST`` TTFTs within ``NORMAL_FACTOR`` of the role's steady median (looked
    for up to ``COLD_LOOKAHEAD`` after the start). A window is never shortened (the caller's is
    the least left out; a first start's may be empty, then only the measured warm-up counts),
    nor stretched when the data cannot say (too few requests, never back to normal)."""
    out = []
    for w in warmup:
        entry = _cold_start(engine, deployment, [w], window, steady)
        end = w.end
        if entry and entry[0]["time_to_normal_s"] is not None:
            measured = w.start.astimezone(UTC) + timedelta(seconds=entry[0]["time_to_normal_s"])
            end = max(end, measured)
        out.append(WarmupWindow(w.role, w.start, end))
    return out


def _measurement(
    key: str,
    est: Estimate,
    unit: str,
    detail: str,
    *,
    with_interval: bool = True,
    level: float = DEFAULT_BOOTSTRAP.level,
) -> Measurement:
    """``est`` as a measurement; ``level``: the level its interval was computed at."""
    value = est.value if est.ok else None
    interval = None
    if with_interval and est.ok and not (math.isnan(est.low) or math.isnan(est.high)):
        interval = Interval(est.low, est.high, level)
    return Measurement(key, value, interval, est.n, unit, detail)


def analyze_latency(
    engine: Engine,
    deployment: str,
    window: Window,
    *,
    warmup: Sequence[WarmupWindow] = (),
    slo: SLO = SLO(),
    progress: Progress | None = None,
    config: BootstrapConfig = DEFAULT_BOOTSTRAP,
    now: datetime | None = None,
    refresh: bool = True,
    shadow_timeout_s: float = 120.0,
    parity: ParityConfig = DEFAULT_PARITY,
    version_changes: Sequence[VersionChange] = (),
) -> LatencySection:
    """The latency section of ``deployment`` over ``window`` (see the module docstring).

    Refreshes the hourly rollups first (only hours not rolled up yet, and the open hour), so it
    can be called on a live deployment. ``config`` sets the bootstrap sizes; ``now`` the clock
    that decides which hours are closed; ``refresh=False`` reads the rollups as they are (a
    read-only database role)."""
    lo, hi = _check(window, warmup)

    def report(stage: str, fraction: float) -> None:
        if progress:
            progress(stage, fraction)

    if refresh:
        refresh_rollups(
            engine,
            deployment,
            (lo, hi),
            progress=(lambda _s, f: report("latency: rollups", 0.5 * f)),
            now=now,
        )
    # the month's stored sketch rows: read while the sample's statistics are computed
    stored_sketches = _in_background(engine, load_stored_sketches, engine, deployment, (lo, hi))
    sample = load_sample(engine, deployment, (lo, hi), target=config.max_pairs)
    cols = sample.columns
    warmup = _until_normal(engine, deployment, warmup, (lo, hi), _steady_from_sample(cols))
    exclude: dict[str, list[tuple[datetime, datetime]]] = {}
    for w in warmup:
        exclude.setdefault(w.role, []).append((w.start.astimezone(UTC), w.end.astimezone(UTC)))

    all_spans = merge_intervals(s for spans in exclude.values() for s in spans)
    in_warmup = _in_any(cols["sent_at"], all_spans)
    status_ok = np.array(
        [
            a == "ok" and b == "ok"
            for a, b in zip(cols["incumbent_status"], cols["candidate_status"], strict=True)
        ],
        dtype=bool,
    )
    keep_pairs = ~in_warmup
    paired = keep_pairs & status_ok
    n_paired = int(paired.sum())

    measurements: list[Measurement] = []
    compared: list[tuple[str, dict[str, Estimate], Estimate, PairedComparison]] = []
    hours = list(cols["hour"])
    paired_blocks = _blocks(hours, paired, config)
    unit_text = (
        f"{BLOCK_METHOD} ({paired_blocks.describe()})"
        if paired_blocks is not None
        else (
            "pairs resampled one by one (assumes independent pairs)"
            if config.unit == "pairs"
            else f"pairs resampled one by one: fewer than {MIN_HOURS} hours of sampled pairs"
            " are too few blocks to resample (assumes independent pairs)"
        )
    )
    sample_note = (
        f"paired statistics from a random sample of {n_paired} pairs (both ok, warm-up left"
        f" out) of {sample.n_pairs_total} in the window, drawn in SQL per hour in proportion to"
        f" the hour's traffic; percentile bootstrap, {config.n_resamples} resamples,"
        f" {unit_text}"
    )
    for mi, metric in enumerate(METRICS):
        report("latency: bootstrap", 0.5 + 0.35 * mi / len(METRICS))
        column = _SAMPLE_COLUMN[metric]
        inc_vals = _floats(cols[f"incumbent_{column}"])[paired]
        cand_vals = _floats(cols[f"candidate_{column}"])[paired]
        comp = paired_comparison(inc_vals, cand_vals, config, blocks=paired_blocks)
        ratios, spread = comp.ratios, comp.spread_ratio
        detail = sample_note
        if metric == "itl":
            ids = [(p, h) for p, h, k in zip(cols["pair_id"], hours, paired, strict=True) if k]
            rng = np.random.default_rng(config.seed)
            pick = [ids[i] for i in subsample(len(ids), config.pooled_max_pairs, rng)]
            gaps = load_itl(engine, deployment, [p for p, _ in pick], [h for _, h in pick])
            both = [
                (p, h) for p, h in pick if (p, "incumbent") in gaps and (p, "candidate") in gaps
            ]
            itl_blocks = (
                blocks_from_hours([h for _, h in both])
                if paired_blocks is not None and both
                else None
            )
            ratios, spread = pooled_comparison(
                [gaps[(p, "incumbent")] for p, _ in both],
                [gaps[(p, "candidate")] for p, _ in both],
                config,
                blocks=itl_blocks,
            )
            detail = (
                f"ITL gaps pooled per pair over {len(both)} sampled pairs, bootstrap of whole"
                f" pairs ({config.pooled_resamples} resamples;"
                f" {'by days and hours' if itl_blocks is not None else 'pair by pair'});"
                " the median delta and rank test compare each pair's mean ITL"
            )
        for q in QUANTILES:
            measurements.append(
                _measurement(
                    f"latency.{metric}.{q}.ratio", ratios[q], "ratio", detail, level=config.level
                )
            )
        measurements.append(
            _measurement(
                f"latency.{metric}.median_delta",
                comp.median_delta,
                UNITS[metric],
                "median over pairs of candidate - incumbent; " + sample_note,
                level=config.level,
            )
        )
        measurements.append(
            _measurement(
                f"latency.{metric}.spread_ratio",
                spread,
                "ratio",
                "candidate / incumbent (p99 - p50): catches a wider spread at the same median",
                level=config.level,
            )
        )
        measurements.append(
            Measurement(
                f"latency.{metric}.rank_test_p",
                None if math.isnan(comp.rank_test_p) else comp.rank_test_p,
                None,
                comp.n,
                "p-value",
                "paired Wilcoxon signed-rank test (two-sided) on the sampled pairs",
            )
        )
        compared.append((metric, ratios, spread, comp))

    # failures counted as slowest, both roles censored at the shadow timeout
    censored, censored_table = _with_failures(cols, keep_pairs, hours, config, shadow_timeout_s)
    measurements += censored

    # goodput: every sampled pair outside warm-up, failed requests are not good
    report("latency: goodput", 0.9)
    good = {}
    for role in ROLES:
        good[role] = goodput_mask(
            np.array([s == "ok" for s in cols[f"{role}_status"]], dtype=bool),
            _floats(cols[f"{role}_ttft_s"]),
            _floats(cols[f"{role}_tpot_s"]),
            _floats(cols[f"{role}_e2e_s"]),
            ttft_slo=slo.ttft_s,
            tpot_slo=slo.tpot_s,
            e2e_slo=slo.e2e_s,
        )[keep_pairs]
    n_good = int(keep_pairs.sum())
    delta = share_delta(
        good["incumbent"], good["candidate"], config, blocks=_blocks(hours, keep_pairs, config)
    )
    goodput: dict[str, Any] = {"slo": slo.to_dict(), "delta": delta.to_dict()}
    for role in ROLES:
        k = int(good[role].sum())
        iv = wilson_interval(k, n_good)
        goodput[role] = {
            "good": k,
            "n": n_good,
            "share": k / n_good if n_good else None,
            "low": iv.low if iv else None,
            "high": iv.high if iv else None,
        }
    measurements.append(
        _measurement(
            "latency.goodput.delta",
            delta,
            "share",
            "candidate - incumbent share of requests meeting every SLO (vLLM's goodput"
            f" rule: completed and <= {slo.to_dict()}), on {n_good} sampled pairs, paired"
            " bootstrap",
            level=config.level,
        )
    )
    rows = SketchColumns.concat(
        [
            stored_sketches(),
            load_raw_sketches(engine, deployment, (lo, hi), exclude=exclude),
        ]
    )
    sketches = group_sketches(rows)
    report("latency: sketches", 0.97)
    overall = [
        {
            "metric": metric,
            "unit": UNITS[metric],
            "incumbent": _qs(sketches.get(("all", "", "incumbent", metric, "all"))),
            "candidate": _qs(sketches.get(("all", "", "candidate", metric, "all"))),
            "ratio": {q: ratios[q].to_dict() for q in QUANTILES},
            "spread_ratio": spread.to_dict(),
            "median_delta": comp.median_delta.to_dict(),
            "rank_test_p": None if math.isnan(comp.rank_test_p) else comp.rank_test_p,
        }
        for metric, ratios, spread, comp in compared
    ]
    steady: dict[str, float] = {}
    for role in ROLES:
        sk = sketches.get(("all", "", role, "ttft", "all"))
        if sk is not None and sk.count:
            steady[role] = sk.quantile(0.5)
    cold = _cold_start(engine, deployment, warmup, (lo, hi), steady)

    excluded = {}
    for role in ROLES:
        removed = sum(
            int(n)
            for n, s, r, m, sl in zip(
                rows.n_values, rows.sign, rows.role, rows.metric, rows.slice, strict=True
            )
            if s < 0 and r == role and m == "e2e" and sl == "all"
        )
        excluded[role] = removed

    cdf: dict[str, Any] = {}
    weekly: dict[str, Any] = {}
    weeks = sorted({k[1] for k in sketches if k[0] == "week"})
    for metric in METRICS:
        cdf[metric] = {}
        weekly[metric] = {}
        for role in ROLES:
            sk = sketches.get(("all", "", role, metric, "all"))
            values, probs = sk.cdf_points() if sk else ([], [])
            cdf[metric][role] = {"values": values, "probs": probs}
            series = []
            for wk in weeks:
                wsk = sketches.get(("week", wk, role, metric, "all"))
                p95 = wsk.quantile(0.95) if wsk and wsk.count else math.nan
                series.append(None if math.isnan(p95) else p95)
            weekly[metric][role] = {"weeks": weeks, "values": series}

    n_role = {
        role: (sk.count if (sk := sketches.get(("all", "", role, "e2e", "all"))) else 0)
        for role in ROLES
    }
    tables: dict[str, Any] = {
        "method": {
            "sketch_relative_accuracy": RELATIVE_ACCURACY,
            "bootstrap": {
                "method": "percentile",
                "n_resamples": config.n_resamples,
                "max_pairs": config.max_pairs,
                "pooled_resamples": config.pooled_resamples,
                "pooled_max_pairs": config.pooled_max_pairs,
                "level": config.level,
                "unit": config.unit,
                "resampled": unit_text,
            },
            "sample": "per hour, pairs ordered by random() in SQL; hours weighted by traffic",
        },
        "n": {
            **n_role,
            "pairs": sample.n_pairs_total,
            "pairs_sampled": n_paired,
            "warmup_excluded": excluded,
        },
        "overall": overall,
        "by_day": _period_table(sketches, "day", "day"),
        "by_week": _period_table(sketches, "week", "week"),
        "by_load": _bucket_table(sketches, "load"),
        "by_prompt_length": _bucket_table(sketches, "prompt"),
        "by_output_length": _bucket_table(sketches, "output"),
        "goodput": goodput,
        "cold_start": cold,
        "with_failures": censored_table,
    }
    notes = [
        "Only status = ok exchanges count for latency; quantiles per role come from hourly"
        f" log-bucketed sketches (within {RELATIVE_ACCURACY:.0%} of the exact values).",
        sample_note + ".",
        "Load level = requests in flight at the incumbent at dispatch; prompt and output"
        " length buckets use each exchange's own token counts.",
    ]
    if warmup:
        notes.append(
            f"{len(all_spans)} warm-up span(s) after engine (re)starts left out"
            f" ({excluded['incumbent']} incumbent and {excluded['candidate']} candidate"
            " exchanges); see cold_start."
        )
    if version_changes:
        tables["upgrades"] = _upgrade_latency(
            engine, deployment, (lo, hi), version_changes, exclude
        )
    load = load_parity(engine, deployment, (lo, hi))
    reason = parity_reason(load, parity)
    load["inconclusive"] = reason or None
    tables["load_parity_by_bucket"] = load.pop("by_load")
    tables["load_parity"] = load
    tables["by_concurrency"] = _concurrency_curve(cols, keep_pairs & status_ok, config)
    if reason:
        measurements = [replace(m, inconclusive=reason) for m in measurements]
        notes.append("Latency criteria are INCONCLUSIVE: " + reason + ".")
    report("latency: done", 1.0)
    return LatencySection(
        deployment=deployment,
        window=(lo, hi),
        slo=slo,
        measurement_list=tuple(measurements),
        tables=tables,
        plots={"cdf": cdf, "weekly_p95": weekly},
        notes=tuple(notes),
    )
