"""Pure statistics of the latency comparison: plain numpy arrays in, plain values out, no I/O.

- :func:`paired_comparison`: for pairs (incumbent, candidate) of one metric, the ratios
  candidate/incumbent of p50/p95/p99, the spread ratio (p99 - p50) and the median of the
  per-pair deltas, each with a paired percentile bootstrap interval (``scipy.stats.bootstrap``:
  pairs are resampled together), and the paired Wilcoxon signed-rank p-value;
- :func:`pooled_comparison`: the same ratios for a metric with many values per pair (ITL: the
  gaps of every pair pooled, as vLLM's benchmark pools them), resampling whole pairs (a cluster
  bootstrap, each resample a weighted quantile);
- :func:`share_delta`: candidate - incumbent share of a paired yes/no outcome (goodput), with a
  paired bootstrap interval (one share's interval: :func:`evaluator.rates.wilson_interval`);
- :func:`goodput_mask`: which requests meet the SLOs, as vLLM's benchmark decides it.

Sizes are capped for speed (:class:`BootstrapConfig`): at most ``max_pairs`` pairs (a random
subsample, 40 000 by default: with whole days and hours resampled, the weighted quantiles of
:class:`evaluator.blocks.GroupedQuantiles` (each comparison's values sorted once, a month's
resamples weighing its days rather than its hours) take 999 resamples of 40 000 pairs in about
0.1 s of CPU per metric on this machine under load, a sixth of the per-hour form that sorted
the values again for every batch of resamples, with the same values bit for bit
(tests/evaluator/test_review_cost.py); expanding the weights to every pair took 3.2-3.7 s for
10 000: ``bench/latency_sample_cost.py``) and ``n_resamples``
resamples (999; 199 for pooled metrics, which cost a pass over every value per resample; those
use at most 2 000 pairs). Percentile intervals, not BCa: BCa's jackknife is O(n^2) at these
sizes; beyond the levels the resamples resolve (fewer than 4 beyond a bound: 999 resamples,
levels above 99.2 %, which the sequential plan's looks ask for) the normal approximation with
the resamples' standard deviation, on the log scale for ratios
(:func:`evaluator.blocks.bootstrap_interval`).

Errors: none of its own; a statistic without data is NaN (see :class:`Estimate`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from evaluator.blocks import (
    Blocks,
    GroupedQuantiles,
    block_bootstrap,
    bootstrap_interval,
    hour_weighted_quantiles,
    resample_units,
    resolvable,
    weighted_quantiles_rows,
)

FloatArray = npt.NDArray[np.float64]
QS = (0.50, 0.95, 0.99)


@dataclass(frozen=True)
class BootstrapConfig:
    """How the intervals are computed: resamples, pair cap, confidence level and seed."""

    n_resamples: int = 999
    max_pairs: int = 40_000
    """The paired sample's cap (the review's SQL sample draws this many, in proportion to each
    hour's pairs). 40 000 rather than 10 000: past ~13 pairs an hour a month's latency
    interval still narrows with the sample (the TTFT p95 power at x1.12 needs it)."""
    pooled_resamples: int = 199
    pooled_max_pairs: int = 2_000
    level: float = 0.95
    seed: int = 20261130
    batch: int = 50
    """Resamples computed at once (memory: batch x pairs x 8 bytes per array)."""
    unit: str = "blocks"
    """What the latency intervals resample: ``"blocks"`` (whole days, then hours within them:
    :mod:`evaluator.blocks`) or ``"pairs"`` (single pairs, which takes correlated pairs for
    independent ones; kept to compare)."""


@dataclass(frozen=True)
class Estimate:
    """A statistic with its interval; NaN value when there was no data, NaN bounds when no
    interval could be computed (fewer than 2 pairs, or every resample the same)."""

    value: float
    low: float
    high: float
    n: int

    @property
    def ok(self) -> bool:
        return not math.isnan(self.value)

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "value": _json_float(self.value),
            "low": _json_float(self.low),
            "high": _json_float(self.high),
            "n": self.n,
        }


NAN_ESTIMATE = Estimate(math.nan, math.nan, math.nan, 0)


@dataclass(frozen=True)
class PairedComparison:
    """Candidate vs incumbent on one metric, from pairs."""

    ratios: dict[str, Estimate]
    """"p50"/"p95"/"p99": candidate quantile / incumbent quantile."""
    spread_ratio: Estimate
    """(p99 - p50) candidate / (p99 - p50) incumbent."""
    median_delta: Estimate
    """Median over pairs of candidate - incumbent (the metric's unit)."""
    rank_test_p: float
    """Paired Wilcoxon signed-rank test, two-sided; NaN when it cannot be computed."""
    n: int


def _json_float(x: float) -> float | None:
    return None if math.isnan(x) or math.isinf(x) else float(x)


def quantiles(values: npt.ArrayLike, qs: Sequence[float] = QS) -> FloatArray:
    """Quantiles with linear interpolation (numpy's default, as vLLM's benchmark uses)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return np.full(len(qs), np.nan)
    return np.asarray(np.quantile(arr, qs), dtype=np.float64)


def _finite_pairs(
    inc: npt.ArrayLike, cand: npt.ArrayLike, blocks: Blocks | None = None
) -> tuple[FloatArray, FloatArray, Blocks | None]:
    a = np.asarray(inc, dtype=np.float64)
    b = np.asarray(cand, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in length: {a.shape} vs {b.shape}")
    if blocks is not None and len(blocks) != a.size:
        raise ValueError(f"blocks for {len(blocks)} pairs, values for {a.size}")
    keep = np.isfinite(a) & np.isfinite(b)
    if blocks is not None and not keep.all():
        blocks = blocks.take(np.flatnonzero(keep))
    return a[keep], b[keep], blocks


def subsample(n: int, cap: int, rng: np.random.Generator) -> npt.NDArray[np.intp]:
    """Indexes of a random subsample of at most ``cap`` of ``n`` items (all when n <= cap)."""
    if n <= cap:
        return np.arange(n)
    return np.sort(rng.choice(n, size=cap, replace=False))


def _ratio(num: FloatArray | float, den: FloatArray | float) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.divide(num, den), dtype=np.float64)


def _paired_statistic(a: FloatArray, b: FloatArray, axis: int = -1) -> FloatArray:
    """[r50, r95, r99, spread ratio, median delta] along ``axis``."""
    qa = np.quantile(a, QS, axis=axis)
    qb = np.quantile(b, QS, axis=axis)
    ratios = _ratio(qb, qa)
    spread = _ratio(qb[2] - qb[0], qa[2] - qa[0])
    delta = np.median(b - a, axis=axis)
    return np.concatenate([ratios, spread[None], np.asarray(delta)[None]], axis=0)


class _Resampled:
    """Order statistics of resamples of fixed (finite) ``values``: row r of ``idx`` is a
    resample ``values[idx[r]]``; its sorted k-th value is read from how often each sorted
    position was drawn (one count, one running sum per batch of resamples) instead of a
    partition of every resample."""

    def __init__(self, values: FloatArray) -> None:
        order = np.argsort(values, kind="stable")
        self.sorted = values[order]
        self.rank = np.empty(values.size, dtype=np.intp)
        self.rank[order] = np.arange(values.size)

    def running(self, idx: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
        """Per resample (row of ``idx``), how many drawn values sit at or before each sorted
        position: ``(rows, len(values))``."""
        rows, n = idx.shape[0], self.sorted.size
        drawn = np.bincount(
            (np.arange(rows)[:, None] * n + self.rank[idx]).ravel(), minlength=rows * n
        )
        return np.cumsum(drawn.reshape(rows, n), axis=1)

    def at(self, running: npt.NDArray[np.int64], k: int) -> FloatArray:
        """Each resample's k-th smallest value (0-based): at the first sorted position whose
        running count passes k (one search over the rows laid end to end, each row's counts
        lifted above the previous row's)."""
        rows, n = running.shape
        lift = np.arange(rows) * (int(running[0, -1]) + 1)
        flat = (running + lift[:, None]).ravel()
        pos = np.searchsorted(flat, k + lift, side="right") - np.arange(rows) * n
        return self.sorted[pos]

    def quantiles(self, running: npt.NDArray[np.int64], m: int, qs: Sequence[float]) -> FloatArray:
        """``np.quantile(values[idx], qs, axis=-1)`` (the default "linear" method) of resamples
        of size ``m``: the same virtual index ``(m - 1) q``, the same neighbours (the last
        value beyond the end) and the same two-sided interpolation as numpy's ``_lerp``, so
        the same floating-point values (checked against numpy in tests/evaluator)."""
        out = []
        for q in np.asarray(qs, dtype=np.float64):
            virtual = (m - 1) * q
            prev = math.floor(virtual)
            if virtual >= m - 1:
                lo = hi = self.at(running, m - 1)
                gamma = virtual + 1.0  # numpy takes the last value for both, index -1
            else:
                lo, hi = self.at(running, prev), self.at(running, prev + 1)
                gamma = virtual - prev
            diff = hi - lo
            value = lo + diff * gamma
            if gamma >= 0.5:
                value = hi - diff * (1 - gamma)
            out.append(value)
        return np.array(out)

    def median(self, running: npt.NDArray[np.int64], m: int) -> FloatArray:
        """``np.median(values[idx], axis=-1)`` of resamples of size ``m`` (the mean of the two
        middle values when ``m`` is even, as numpy computes it)."""
        if m % 2:
            return self.at(running, (m - 1) // 2)
        return (self.at(running, m // 2 - 1) + self.at(running, m // 2)) / 2


def _resampled_paired_statistic(a: FloatArray, b: FloatArray) -> Callable[..., FloatArray]:
    """:func:`_paired_statistic` of the resampled pairs ``(a[idx], b[idx])`` as a function of
    the resample indexes ``idx`` (rows of ``scipy.stats.bootstrap``'s draws): the same values,
    read from counts of the sorted values (:class:`_Resampled`) rather than from a partition
    of each resample."""
    ra, rb, rd = _Resampled(a), _Resampled(b), _Resampled(b - a)

    def statistic(idx: npt.NDArray[np.intp], axis: int = -1) -> FloatArray:
        rows = np.asarray(idx).reshape(-1, np.shape(idx)[-1])
        m = rows.shape[1]
        ca, cb = ra.running(rows), rb.running(rows)
        qa, qb = ra.quantiles(ca, m, QS), rb.quantiles(cb, m, QS)
        ratios = _ratio(qb, qa)
        spread = _ratio(qb[2] - qb[0], qa[2] - qa[0])
        delta = rd.median(rd.running(rows), m)
        out = np.concatenate([ratios, spread[None], delta[None]], axis=0)
        return out.reshape((5, *np.shape(idx)[:-1]))

    return statistic


def _bootstrap(
    n: int,
    statistic: object,
    *,
    n_resamples: int,
    config: BootstrapConfig,
    rng: np.random.Generator,
    vectorized: bool = True,
    point: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Percentile bootstrap over indexes 0..n-1 (pairs resampled together): (low, high); with
    ``point``, the normal approximation about it beyond the levels ``n_resamples`` resolve
    (:func:`evaluator.blocks.bootstrap_interval`)."""
    with warnings.catch_warnings():
        # degenerate resamples (every value equal) give NaN bounds, reported as such
        warnings.simplefilter("ignore", sps.DegenerateDataWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        res = sps.bootstrap(
            (np.arange(n),),
            statistic,
            vectorized=vectorized,
            n_resamples=n_resamples,
            batch=config.batch if vectorized else None,
            confidence_level=config.level,
            method="percentile",
            rng=rng,
        )
    if point is not None and not resolvable(config.level, n_resamples):
        reps = np.asarray(res.bootstrap_distribution, dtype=np.float64).reshape(len(point), -1)
        low, high, _ = bootstrap_interval(reps.T, config.level, np.asarray(point))
        return low, high
    low = np.asarray(res.confidence_interval.low, dtype=np.float64)
    high = np.asarray(res.confidence_interval.high, dtype=np.float64)
    return low, high


def _estimates(point: FloatArray, low: FloatArray, high: FloatArray, n: int) -> list[Estimate]:
    out = []
    for v, lo, hi in zip(point, low, high, strict=True):
        lo_, hi_ = float(lo), float(hi)
        if not (math.isnan(lo_) or math.isnan(hi_)) and lo_ > hi_:
            lo_, hi_ = hi_, lo_
        out.append(Estimate(float(v), lo_, hi_, n))
    return out


def wilcoxon_p(inc: FloatArray, cand: FloatArray) -> float:
    """Two-sided paired Wilcoxon signed-rank p-value; 1.0 when every delta is zero, NaN with
    fewer than 2 pairs."""
    if inc.size < 2:
        return math.nan
    d = cand - inc
    if not np.any(d != 0):
        return 1.0
    res = sps.wilcoxon(cand, inc, zero_method="wilcox", alternative="two-sided")
    return float(res.pvalue)


def _hour_weighted_paired_statistic(
    a: FloatArray, b: FloatArray, blocks: Blocks, hw: FloatArray
) -> FloatArray:
    """:func:`_weighted_paired_statistic` under item weights ``hw[:, blocks.hour_of]``, from the
    hour weights ``hw`` (k, n_hours) without expanding them (the same values, far cheaper on
    tens of thousands of pairs: :func:`evaluator.blocks.hour_weighted_quantiles`)."""
    qa = hour_weighted_quantiles(a, blocks, hw, QS)
    qb = hour_weighted_quantiles(b, blocks, hw, QS)
    ratios = _ratio(qb, qa)
    spread = _ratio(qb[2] - qb[0], qa[2] - qa[0])
    delta = hour_weighted_quantiles(b - a, blocks, hw, (0.5,))
    return np.concatenate([ratios, spread[None], delta], axis=0)


def _unit_weighted_paired_statistic(
    a: FloatArray, b: FloatArray, blocks: Blocks
) -> Callable[[FloatArray], FloatArray]:
    """:func:`_hour_weighted_paired_statistic` as a function of the weights of the resample
    units (:func:`evaluator.blocks.resample_units`: the days of a month), the values sorted
    once for every batch of resamples (:class:`evaluator.blocks.GroupedQuantiles`): the same
    values."""
    unit_of, n_units = resample_units(blocks)
    qa = GroupedQuantiles(a, unit_of, n_units, QS)
    qb = GroupedQuantiles(b, unit_of, n_units, QS)
    qd = GroupedQuantiles(b - a, unit_of, n_units, (0.5,))

    def statistic(w: FloatArray) -> FloatArray:
        xa, xb = qa(w), qb(w)
        ratios = _ratio(xb, xa)
        spread = _ratio(xb[2] - xb[0], xa[2] - xa[0])
        return np.concatenate([ratios, spread[None], qd(w)], axis=0)

    return statistic


def _weighted_paired_statistic(a: FloatArray, b: FloatArray, w: FloatArray) -> FloatArray:
    """:func:`_paired_statistic` of every weight row ``w`` (k, n): (5, k)."""
    qa = weighted_quantiles_rows(a, w, QS)
    qb = weighted_quantiles_rows(b, w, QS)
    ratios = _ratio(qb, qa)
    spread = _ratio(qb[2] - qb[0], qa[2] - qa[0])
    delta = weighted_quantiles_rows(b - a, w, (0.5,))
    return np.concatenate([ratios, spread[None], delta], axis=0)


def paired_comparison(
    inc: npt.ArrayLike,
    cand: npt.ArrayLike,
    config: BootstrapConfig = BootstrapConfig(),
    *,
    blocks: Blocks | None = None,
) -> PairedComparison:
    """Candidate vs incumbent on one metric from paired values (non-finite pairs dropped).
    With ``blocks`` (each pair's hour and day) the intervals resample whole days and hours
    (:mod:`evaluator.blocks`), else single pairs. Values may be ``inf`` on either side only
    through :func:`censored_comparison` (failures counted as slowest)."""
    a, b, blocks = _finite_pairs(inc, cand, blocks)
    return _paired(a, b, config, blocks)


def _paired(
    a: FloatArray, b: FloatArray, config: BootstrapConfig, blocks: Blocks | None
) -> PairedComparison:
    rng = np.random.default_rng(config.seed)
    keep = subsample(a.size, config.max_pairs, rng)
    a, b = a[keep], b[keep]
    if blocks is not None and keep.size != len(blocks):
        blocks = blocks.take(keep)
    n = int(a.size)
    if n == 0:
        return PairedComparison(
            {k: NAN_ESTIMATE for k in ("p50", "p95", "p99")},
            NAN_ESTIMATE,
            NAN_ESTIMATE,
            math.nan,
            0,
        )
    point = _paired_statistic(a, b)
    if n >= 2 and blocks is not None:
        low, high = block_bootstrap(
            blocks,
            _unit_weighted_paired_statistic(a, b, blocks),
            per_unit=True,
            n_resamples=config.n_resamples,
            level=config.level,
            rng=rng,
            batch=config.batch,
            point=point,
        )
    elif n >= 2:
        low, high = _bootstrap(
            n,
            _resampled_paired_statistic(a, b),
            n_resamples=config.n_resamples,
            config=config,
            rng=rng,
            point=point,
        )
    else:
        low = high = np.full(point.shape, np.nan)
    est = _estimates(point, low, high, n)
    return PairedComparison(
        ratios={"p50": est[0], "p95": est[1], "p99": est[2]},
        spread_ratio=est[3],
        median_delta=est[4],
        rank_test_p=wilcoxon_p(a, b),
        n=n,
    )


def weighted_quantiles(
    sorted_values: FloatArray, weights: FloatArray, qs: Sequence[float] = QS
) -> FloatArray:
    """Quantiles (inverted CDF) of ``sorted_values`` (ascending) repeated ``weights`` times."""
    cum = np.cumsum(weights)
    total = cum[-1] if cum.size else 0.0
    if total <= 0:
        return np.full(len(qs), np.nan)
    targets = np.asarray(qs) * total
    idx = np.searchsorted(cum, targets, side="left")
    return sorted_values[np.minimum(idx, sorted_values.size - 1)]


def pooled_comparison(
    inc_groups: Sequence[npt.ArrayLike],
    cand_groups: Sequence[npt.ArrayLike],
    config: BootstrapConfig = BootstrapConfig(),
    *,
    blocks: Blocks | None = None,
) -> tuple[dict[str, Estimate], Estimate]:
    """Ratios of pooled quantiles (p50/p95/p99) and the spread ratio for a metric with many
    values per pair (ITL gaps): pair i's incumbent values are ``inc_groups[i]``, its candidate
    values ``cand_groups[i]``. The interval resamples whole pairs (cluster bootstrap): each
    resample weighs every value by how often its pair was drawn."""
    if len(inc_groups) != len(cand_groups):
        raise ValueError("pooled_comparison: one group per pair on each side")
    rng = np.random.default_rng(config.seed)
    keep = subsample(len(inc_groups), config.pooled_max_pairs, rng)
    if blocks is not None:
        if len(blocks) != len(inc_groups):
            raise ValueError(f"blocks for {len(blocks)} pairs, groups for {len(inc_groups)}")
        blocks = blocks.take(keep)
    sides = []
    for groups in (inc_groups, cand_groups):
        parts = [np.asarray(groups[i], dtype=np.float64) for i in keep]
        values = np.concatenate(parts) if parts else np.empty(0)
        owner = np.repeat(np.arange(len(parts)), [p.size for p in parts])
        finite = np.isfinite(values)
        values, owner = values[finite], owner[finite]
        order = np.argsort(values, kind="stable")
        sides.append((values[order], owner[order]))
    n = len(keep)
    (va, oa), (vb, ob) = sides

    def stat_for(weights_per_pair: FloatArray) -> FloatArray:
        qa = weighted_quantiles(va, weights_per_pair[oa])
        qb = weighted_quantiles(vb, weights_per_pair[ob])
        return np.concatenate([_ratio(qb, qa), [_ratio(qb[2] - qb[0], qa[2] - qa[0])]])

    if va.size == 0 or vb.size == 0:
        nan = {k: NAN_ESTIMATE for k in ("p50", "p95", "p99")}
        return nan, NAN_ESTIMATE
    point = stat_for(np.ones(n))
    if n >= 2 and blocks is not None:
        low, high = block_bootstrap(
            blocks,
            lambda w: np.stack([stat_for(row) for row in w], axis=1),
            n_resamples=config.pooled_resamples,
            level=config.level,
            rng=rng,
            batch=config.batch,
            point=point,
        )
    elif n >= 2:

        def statistic(idx: npt.NDArray[np.intp]) -> FloatArray:
            return stat_for(np.bincount(idx, minlength=n).astype(np.float64))

        low, high = _bootstrap(
            n,
            statistic,
            n_resamples=config.pooled_resamples,
            config=config,
            rng=rng,
            vectorized=False,
        )
    else:
        low = high = np.full(point.shape, np.nan)
    est = _estimates(point, low, high, n)
    return {"p50": est[0], "p95": est[1], "p99": est[2]}, est[3]


def share_delta(
    inc_ok: npt.ArrayLike,
    cand_ok: npt.ArrayLike,
    config: BootstrapConfig = BootstrapConfig(),
    *,
    blocks: Blocks | None = None,
) -> Estimate:
    """mean(cand_ok) - mean(inc_ok) for paired yes/no outcomes, paired bootstrap interval
    (whole days and hours resampled with ``blocks``)."""
    a = np.asarray(inc_ok, dtype=np.float64)
    b = np.asarray(cand_ok, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError("share_delta: paired arrays differ in length")
    rng = np.random.default_rng(config.seed)
    keep = subsample(a.size, config.max_pairs, rng)
    a, b = a[keep], b[keep]
    if blocks is not None:
        blocks = blocks.take(keep)
    n = int(a.size)
    if n == 0:
        return NAN_ESTIMATE
    point = float(b.mean() - a.mean())
    d = b - a
    if n < 2 or not np.any(d != d[0]):
        # every resample gives the same delta: the interval is that point
        return Estimate(point, point, point, n)
    if blocks is not None:
        low, high = block_bootstrap(
            blocks,
            lambda w: ((w @ d) / w.sum(axis=1))[None],
            n_resamples=config.n_resamples,
            level=config.level,
            rng=rng,
            batch=config.batch,
        )
        return Estimate(point, float(low[0]), float(high[0]), n)

    def statistic(idx: npt.NDArray[np.intp], axis: int = -1) -> FloatArray:
        return np.asarray(d[idx].mean(axis=axis))[None]

    low, high = _bootstrap(n, statistic, n_resamples=config.n_resamples, config=config, rng=rng)
    return Estimate(point, float(low[0]), float(high[0]), n)


def goodput_mask(
    completed: npt.ArrayLike,
    ttft: npt.ArrayLike,
    tpot: npt.ArrayLike,
    e2e: npt.ArrayLike,
    *,
    ttft_slo: float | None,
    tpot_slo: float | None,
    e2e_slo: float | None,
) -> npt.NDArray[np.bool_]:
    """Good requests as vLLM's benchmark judges them (``calculate_metrics``): completed, and
    every configured metric <= its SLO. A missing TPOT (one-token answer) counts as 0, as vLLM
    records it; a missing TTFT or E2E fails its SLO."""
    good = np.asarray(completed, dtype=bool).copy()
    for values, slo, missing in (
        (ttft, ttft_slo, np.inf),
        (tpot, tpot_slo, 0.0),
        (e2e, e2e_slo, np.inf),
    ):
        if slo is None:
            continue
        arr = np.asarray(values, dtype=np.float64)
        arr = np.where(np.isnan(arr), missing, arr)
        good &= arr <= slo
    return good
