"""Task quality: probe accuracy per engine, structured-output validity and refusal rate.

Three questions a migration review asks of the answers themselves, each judged against the
incumbent (the floor) on the same requests:

- **Probes** (``synthetic = 'probe'`` exchanges, sent by the mirror to both engines:
  mirror/probes.py). Each answer is checked by its probe (:mod:`shadow_ab.probes`; the set is
  ``QualityConfig.probe_set``, default the shipped one; records of another set are counted as
  ``unscored``). Per engine: accuracy over the window, per UTC day and per ISO week, each with a
  Wilson interval on the effective sample size; the paired accuracy delta (candidate minus
  incumbent) over probes both engines answered (status ok), with Newcombe's paired interval
  (his method 10, from the two Wilson intervals and the correlation phi of the pairs) on the
  effective sample size. A failed answer (not ok) is counted apart, not as wrong: failures are
  judged by ``errors.rate_ratio``.
- **Structured-output validity** over all traffic (client and probes): the pairs whose
  incumbent request asked for JSON (``response_format`` json_object / json_schema, vLLM's
  ``guided_json``): valid when the answer parses as JSON and validates against the schema given
  (:func:`shadow_ab.probes.json_verdict`). Paired delta, candidate minus incumbent.
- **Refusal rate** over all traffic: :func:`shadow_ab.probes.is_refusal` of each side's
  answer. Paired delta, candidate minus incumbent.

**The unit of independence.** A probe asked many times gets the same greedy answer each time,
so the sends of one probe are not independent; client traffic of one hour shares its load and
users. Every interval therefore uses an effective sample size ``n / deff``, with the design
effect ``deff`` = the cluster-robust variance of the mean (clusters: probes for probe figures,
UTC hours for all-traffic figures) over the variance that treats the pairs as independent (at
least 1), as ``rates.compare_dispersed_rates`` divides its counts by phi. *Assumes*: clusters
independent of each other; one accuracy per engine over the window (a drift within it is
averaged). *Does not cover*: a probe set unlike the production traffic (the probe accuracy is
the set's, not the traffic's), refusals worded otherwise than :func:`is_refusal` knows.

All figures are computed on the fly from the exchanges (a bounded sample per UTC day for the
all-traffic figures; for the probe figures at most ``max_sends_per_probe`` sends of each probe,
evenly spread over its sends in time: :func:`spread_sample`); nothing is stored. The probe
sample is chosen by send time alone, never by answer, and keeps every probe, so the clusters
and the design effect are the same kind of estimate as on every send: a greedy engine answers a
probe alike each time, and a month's 144 sends of a probe weigh about as much as a few dozen.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from scipy import stats
from sqlalchemy import Connection, Engine, and_, select

from evaluator.divergence import sample_pair_ids
from evaluator.exchange_rollups import role_extent
from evaluator.rates import bucket_label, bucket_start
from evaluator.results import Interval, Measurement, Progress, Window
from shadow_ab.probes import ProbeSet, is_refusal, json_verdict, load_probe_set
from shadow_ab.timestamps import as_utc
from storage.models import EXCHANGES

DAY = timedelta(days=1)
NO_PROBES = (
    "no probe answered by both engines in the window: the mirror sends probes by default"
    ' (probes.per_minute: 1, mirror/README.md "Probes"); check that it is not 0, that the'
    " shadow_ab_mirror_probes_total{decision} metric shows probes sent, and that the report"
    " scores the mirror's probe set (--probes)"
)


@dataclass(frozen=True)
class QualityConfig:
    """What :func:`analyze_quality` reads and at what level it states its intervals."""

    level: float = 0.95
    probe_set: str | None = None
    """The probe set the probe records are scored against (a JSONL path; None: shipped)."""
    max_pairs_per_day: int = 2000
    """All-traffic figures (validity, refusal): at most this many pairs per UTC day, the
    smallest (random UUID) pair ids: a uniform sample."""
    max_sends_per_probe: int | None = 32
    """Probe figures: at most this many sends (pairs) of each probe over the window, evenly
    spread over its sends in time (:func:`spread_sample`; every probe kept), so the probe
    figures' cost is flat in the window's length (the mirror's default, one probe a minute
    through the 300 shipped probes, sends each probe ~144 times a month). The sends of one
    probe are correlated (a greedy engine answers a probe alike every time: the design effect),
    so past a few dozen sends a probe the interval barely narrows (bench/divergence_month.py
    measures it). None: every send (the review before the cap)."""


# -- intervals --------------------------------------------------------------------------------


def _z(level: float) -> float:
    return float(stats.norm.ppf(0.5 + level / 2.0))


def wilson(p: float, n: float, level: float) -> Interval | None:
    """Wilson score interval of a share ``p`` on ``n`` (not necessarily whole) trials."""
    if n <= 0:
        return None
    z = _z(level)
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return Interval(max(0.0, centre - half), min(1.0, centre + half), level)


def design_effect(units: Sequence[tuple[Any, float]]) -> float:
    """``deff`` of the mean of ``units`` ``(cluster, value)``: the cluster-robust variance of
    the mean over the independent one, at least 1 (1 when either is 0 or there is one
    cluster)."""
    n = len(units)
    if n < 2:
        return 1.0
    mean = sum(v for _, v in units) / n
    resid = [v - mean for _, v in units]
    iid = sum(r * r for r in resid)
    sums: dict[Any, float] = defaultdict(float)
    for (c, _), r in zip(units, resid, strict=True):
        sums[c] += r
    k = len(sums)
    if k < 2 or iid <= 0:
        return 1.0
    clustered = k / (k - 1) * sum(s * s for s in sums.values())
    return max(1.0, clustered / iid)


def share(units: Sequence[tuple[Any, bool]], level: float) -> dict[str, Any]:
    """A share with its Wilson interval on the effective sample size (clusters: the units'
    first member)."""
    n = len(units)
    k = sum(1 for _, v in units if v)
    if n == 0:
        return {"n": 0, "k": 0, "rate": None, "low": None, "high": None, "deff": None}
    deff = design_effect([(c, float(v)) for c, v in units])
    iv = wilson(k / n, n / deff, level)
    assert iv is not None
    return {"n": n, "k": k, "rate": k / n, "low": iv.low, "high": iv.high, "deff": deff}


def paired_delta(
    units: Sequence[tuple[Any, bool, bool]], level: float
) -> tuple[float | None, Interval | None, dict[str, Any]]:
    """``mean(candidate) - mean(incumbent)`` over pairs ``(cluster, candidate, incumbent)``,
    with Newcombe's paired hybrid score interval (method 10) on the effective sample size (the
    design effect of the per-pair differences)."""
    n = len(units)
    if n == 0:
        return None, None, {"n": 0}
    a = sum(1 for _, c, i in units if c and i)
    b = sum(1 for _, c, i in units if c and not i)
    c_ = sum(1 for _, c, i in units if not c and i)
    d = n - a - b - c_
    deff = design_effect([(k, float(c) - float(i)) for k, c, i in units])
    delta = (a + b) / n - (a + c_) / n
    info = {
        "n": n,
        "both": a,
        "candidate_only": b,
        "incumbent_only": c_,
        "neither": d,
        "deff": deff,
    }
    return delta, paired_interval(a, b, c_, d, deff, level), info


def paired_interval(a: int, b: int, c_: int, d: int, deff: float, level: float) -> Interval:
    """Newcombe's paired hybrid score interval (method 10, continuity-corrected phi) of
    ``(a + b) / n - (a + c_) / n`` on the effective sample size ``n / deff``, from the 2x2
    counts (a: both, b: candidate only, c_: incumbent only, d: neither)."""
    n = a + b + c_ + d
    p1, p2 = (a + b) / n, (a + c_) / n
    delta = p1 - p2
    ne = n / deff
    w1, w2 = wilson(p1, ne, level), wilson(p2, ne, level)
    assert w1 is not None and w2 is not None
    denom = (a + b) * (c_ + d) * (a + c_) * (b + d)
    phi = 0.0
    if denom > 0:
        num = float(a * d - b * c_)
        # Newcombe's continuity-corrected phi (his 1998 paper, method 10)
        num = max(num - n / 2.0, 0.0) if num > 0 else num
        phi = num / math.sqrt(denom)
    dl1, du1, dl2, du2 = p1 - w1.low, w1.high - p1, p2 - w2.low, w2.high - p2
    low = delta - math.sqrt(max(0.0, dl1 * dl1 - 2 * phi * dl1 * du2 + du2 * du2))
    high = delta + math.sqrt(max(0.0, du1 * du1 - 2 * phi * du1 * dl2 + dl2 * dl2))
    return Interval(max(-1.0, low), min(1.0, high), level)


def _restate(info: dict[str, Any]) -> Any:
    """:func:`paired_interval` of ``paired_delta``'s counts at any level (``Measurement.restate``);
    None without pairs."""
    if not info.get("n"):
        return None
    return partial(
        paired_interval,
        info["both"],
        info["candidate_only"],
        info["incumbent_only"],
        info["neither"],
        info["deff"],
    )


# -- loading -----------------------------------------------------------------------------------


@dataclass
class _Side:
    status: str
    text: str | None
    request: dict[str, Any]
    probe_id: str | None


@dataclass
class _Pair:
    sent_at: datetime
    sides: dict[str, _Side] = field(default_factory=dict)


def _pairs(rows: Iterable[Any]) -> dict[Any, _Pair]:
    out: dict[Any, _Pair] = {}
    for r in rows:
        sent = as_utc(r.sent_at)
        p = out.get(r.pair_id)
        if p is None:
            p = out[r.pair_id] = _Pair(sent)
        if r.role == "incumbent":
            p.sent_at = sent
        p.sides[r.role] = _Side(r.status, r.output_text, r.request or {}, r.probe_id)
    return out


JSON_REQUEST_FIELDS = ("response_format", "guided_json", "structured_outputs")
"""The request fields :func:`shadow_ab.probes.json_asked` reads: all the all-traffic sample
needs of a request (read from the incumbent's alone, extracted in SQL: a request carries the
prompt, which can be large)."""


def _sample_pairs(rows: Iterable[Any]) -> dict[Any, _Pair]:
    """:func:`_pairs` of the all-traffic sample's rows (pair_id, role, sent_at, status,
    output_text, the :data:`JSON_REQUEST_FIELDS`, probe_id): the same pairs, unpacked by
    position (a month's sample is ~120 000 rows); the incumbent's request as far as
    :func:`json_asked` reads it ({} for the candidate's: whether JSON was asked is the
    incumbent's request's say)."""
    out: dict[Any, _Pair] = {}
    n = len(JSON_REQUEST_FIELDS)
    for pair_id, role, sent_at, status, text, *rest in rows:
        fields, probe_id = rest[:n], rest[n]
        sent = as_utc(sent_at)
        p = out.get(pair_id)
        if p is None:
            p = out[pair_id] = _Pair(sent)
        request: dict[str, Any] = {}
        if role == "incumbent":
            p.sent_at = sent
            request = {
                k: v for k, v in zip(JSON_REQUEST_FIELDS, fields, strict=True) if v is not None
            }
        p.sides[role] = _Side(status, text, request, probe_id)
    return out


def _load_probes(engine: Engine, deployment: str, window: Window) -> dict[Any, _Pair]:
    x = EXCHANGES.c
    stmt = select(
        x.pair_id, x.role, x.sent_at, x.status, x.output_text, x.request, x.probe_id
    ).where(
        x.deployment == deployment,
        x.sent_at >= window[0],
        x.sent_at < window[1],
        x.synthetic.is_not(None),
        x.role.in_(("incumbent", "candidate")),
    )
    with engine.connect() as conn:
        return _pairs(conn.execute(stmt))


def spread_sample(sends: Iterable[tuple[Any, datetime, str]], per_probe: int) -> list[Any]:
    """The pair ids of at most ``per_probe`` sends of each probe: ``sends`` are ``(pair_id,
    sent_at, probe_id)``; each probe's sends in time order (ties by pair id) are cut into
    ``per_probe`` equal runs and the middle send of each run is kept (a systematic sample:
    evenly spread over the probe's sends, so over the window's days as the mirror sends them),
    every send of a probe sent at most ``per_probe`` times. Deterministic: the same sends give
    the same sample, whatever their order. Probes in sorted order, each probe's ids in time
    order."""
    if per_probe < 1:
        raise ValueError(f"max_sends_per_probe must be at least 1, got {per_probe}")
    by_probe: dict[str, list[tuple[datetime, str, Any]]] = defaultdict(list)
    for pair_id, sent, probe in sends:
        by_probe[probe].append((sent, str(pair_id), pair_id))
    out: list[Any] = []
    for probe in sorted(by_probe):
        xs = sorted(by_probe[probe], key=lambda x: (x[0], x[1]))
        m = len(xs)
        if m <= per_probe:
            out.extend(x[2] for x in xs)
        else:
            out.extend(xs[(2 * j + 1) * m // (2 * per_probe)][2] for j in range(per_probe))
    return out


def _probe_sends(
    conn: Connection, deployment: str, window: Window
) -> dict[Any, tuple[datetime, str]]:
    """Every probe pair of the window: pair id -> (sent_at, probe_id), the incumbent's send time
    where it has one (narrow columns only: no text, no request)."""
    x = EXCHANGES.c
    stmt = select(x.pair_id, x.role, x.sent_at, x.probe_id).where(
        x.deployment == deployment,
        x.sent_at >= window[0],
        x.sent_at < window[1],
        x.synthetic.is_not(None),
        x.role.in_(("incumbent", "candidate")),
    )
    out: dict[Any, tuple[datetime, str]] = {}
    for pair_id, role, sent, probe in conn.execute(stmt):
        if role == "incumbent" or pair_id not in out:
            out[pair_id] = (as_utc(sent), probe or "")
    return out


def _load_probe_sample(
    engine: Engine, deployment: str, window: Window, per_probe: int
) -> tuple[dict[Any, _Pair], int]:
    """The probe pairs :func:`spread_sample` keeps (both roles; of each request only the
    :data:`JSON_REQUEST_FIELDS`), and how many probe pairs the window holds."""
    with engine.connect() as conn:
        sends = _probe_sends(conn, deployment, window)
        chosen = spread_sample(((p, t, probe) for p, (t, probe) in sends.items()), per_probe)
        by_day: dict[datetime, list[Any]] = defaultdict(list)
        for pair_id in chosen:
            by_day[bucket_start(sends[pair_id][0], "day")].append(pair_id)
        x = EXCHANGES.c
        fields = [x.request[key].label(f"request_{key}") for key in JSON_REQUEST_FIELDS]
        out: dict[Any, _Pair] = {}
        for day, ids in sorted(by_day.items()):
            for chunk in (ids[i : i + 1000] for i in range(0, len(ids), 1000)):
                stmt = select(
                    x.pair_id, x.role, x.sent_at, x.status, x.output_text, *fields, x.probe_id
                ).where(
                    x.deployment == deployment,
                    x.pair_id.in_(chunk),
                    x.role.in_(("incumbent", "candidate")),
                    x.synthetic.is_not(None),
                    x.sent_at >= max(window[0], day - timedelta(minutes=10)),
                    x.sent_at < min(window[1], day + DAY + timedelta(minutes=10)),
                )
                out.update(_sample_pairs(conn.execute(stmt)))
    return out, len(sends)


READERS = 2
"""Days of the all-traffic sample read at once on PostgreSQL (each on a connection of its
own): the server's reads of one day overlap another's and this process's work; the days are
taken in order, so the sample is the same."""


def _load_sample(
    engine: Engine, deployment: str, window: Window, per_day: int, progress: Progress | None
) -> dict[Any, _Pair]:
    """Up to ``per_day`` pairs per UTC day, both roles, all traffic (probes too): a uniform
    sample (``evaluator.divergence.sample_pair_ids``: table blocks on a big PostgreSQL day, so
    the cost follows the sample, not the day)."""
    out: dict[Any, _Pair] = {}
    day = bucket_start(window[0], "day")
    days = max(1, math.ceil((window[1] - day) / DAY))
    spans = [
        (max(window[0], day + i * DAY), min(window[1], day + (i + 1) * DAY)) for i in range(days)
    ]

    def read(span: tuple[datetime, datetime]) -> list[Any]:
        with engine.connect() as conn:
            return _sample_day(conn, deployment, span[0], span[1], per_day)

    if engine.dialect.name == "postgresql" and days > 1:
        with ThreadPoolExecutor(READERS, thread_name_prefix="shadow-ab-quality") as pool:
            for i, rows in enumerate(pool.map(read, spans)):  # in day order
                out.update(_sample_pairs(rows))
                if progress is not None:
                    progress("quality: all traffic", (i + 1) / days)
        return out
    for i, span in enumerate(spans):
        out.update(_sample_pairs(read(span)))
        if progress is not None:
            progress("quality: all traffic", (i + 1) / days)
    return out


def _sample_day(
    conn: Connection, deployment: str, lo: datetime, hi: datetime, per_day: int
) -> list[Any]:
    """The exchange rows (both roles) of up to ``per_day`` pairs whose candidate was sent in
    ``[lo, hi)``."""
    x = EXCHANGES.c
    # the day's client count (rollups where closed) sizes the block sample of a big day
    total, _, _ = role_extent(conn, deployment, ("candidate",), (lo, hi))
    if not total:
        return []
    chosen = sample_pair_ids(
        conn, deployment, "candidate", lo, hi, per_day, int(total), probes=True
    )
    # only the request fields that say whether JSON was asked (and its schema)
    fields = [x.request[key].label(f"request_{key}") for key in JSON_REQUEST_FIELDS]
    stmt = select(x.pair_id, x.role, x.sent_at, x.status, x.output_text, *fields, x.probe_id).where(
        and_(
            x.deployment == deployment,
            x.pair_id.in_(chosen),
            x.role.in_(("incumbent", "candidate")),
            x.sent_at >= lo - timedelta(minutes=10),
            x.sent_at < hi + timedelta(minutes=10),
        )
    )
    return list(conn.execute(stmt).all())


# -- the section ------------------------------------------------------------------------------


@dataclass
class QualitySection:
    """Probe accuracy, structured-output validity and refusal rate (:func:`analyze_quality`)."""

    deployment: str
    window: Window
    config: QualityConfig
    probe_set: dict[str, Any]
    probes: dict[str, Any]
    json: dict[str, Any]
    refusal: dict[str, Any]
    _measurements: list[Measurement] = field(default_factory=list)

    def measurements(self) -> list[Measurement]:
        return list(self._measurements)

    def to_dict(self) -> dict[str, Any]:
        """Tables for the report (``comparison``, ``per_day`` (each engine's probe accuracy, JSON
        validity and refusal rate per UTC day), ``probe_accuracy`` per engine over the window,
        per UTC day and per ISO week, ``probe_accuracy_by_kind``), the probe set, the method;
        ``detail`` holds the nested figures (``probes``, ``json``, ``refusal``)."""
        return {
            "comparison": self.comparison(),
            "per_day": self.per_day(),
            "probe_accuracy": self.accuracy_rows(),
            "probe_accuracy_by_kind": [
                {
                    "kind": row["kind"],
                    **{role: _iv(row[role]) for role in ("incumbent", "candidate")},
                    "n": {role: row[role]["n"] for role in ("incumbent", "candidate")},
                }
                for row in self.probes.get("by_kind", [])
            ],
            "probe_set": {
                **self.probe_set,
                "unscored answers": self.probes.get("unscored", 0),
                "probe pairs read": self._probe_sample_text(),
                "failed answers": {
                    role: e.get("failed", 0)
                    for role, e in (self.probes.get("engines") or {}).items()
                },
            },
            "detail": {"probes": self.probes, "json": self.json, "refusal": self.refusal},
            "level": self.config.level,
            "method": {
                "probes": "each answer checked by its probe (shadow_ab/probes.py); Wilson"
                " intervals per engine and Newcombe's paired interval (method 10) for the"
                " delta, on the effective sample size (clusters: probes)",
                "json": "pairs whose request asked JSON: parsed, and valid against the schema"
                " given; paired delta candidate - incumbent (clusters: UTC hours)",
                "refusal": "refusal phrases in the first 300 characters; paired delta"
                " candidate - incumbent (clusters: UTC hours)",
                "sample": f"all traffic: at most {self.config.max_pairs_per_day} pairs a UTC"
                f" day; probes: {self._probe_sample_text()}",
            },
        }

    def _probe_sample_text(self) -> str:
        """How many probe pairs the probe figures read, of how many the window holds."""
        sample = self.probes.get("sample") or {}
        read, total = sample.get("pairs read", 0), sample.get("pairs", 0)
        cap = sample.get("max sends per probe")
        if cap is None or read >= total:
            return f"every probe pair ({total:,})"
        return (
            f"{read:,} of {total:,} probe pairs (at most {cap} sends of each probe, evenly"
            " spread over its sends in time; a probe's sends are answered alike, so more"
            " barely narrow the interval; the failed and unscored answers are counted among"
            " the pairs read)"
        )

    def per_day(self) -> list[dict[str, Any]]:
        """One row per UTC day: each engine's probe accuracy, JSON validity and refusal rate
        (shares of that day's answers; the intervals are the window's, in ``comparison``)."""
        days: dict[str, dict[str, Any]] = defaultdict(dict)
        engines = self.probes.get("engines") or {}
        for role in ("incumbent", "candidate"):
            for entry in (engines.get(role) or {}).get("by_day", []):
                row = days[entry["day"]]
                row["probe answers"] = max(row.get("probe answers", 0), entry.get("n", 0))
                row[f"probe accuracy ({role})"] = entry.get("rate")
        for name, fig in (("JSON validity", self.json), ("refusal rate", self.refusal)):
            for entry in fig.get("by_day", []):
                row = days[entry["day"]]
                row[f"{name} pairs"] = entry["n"]
                row[f"{name} (incumbent)"] = entry["incumbent"]
                row[f"{name} (candidate)"] = entry["candidate"]
        columns = [
            "probe answers",
            "probe accuracy (incumbent)",
            "probe accuracy (candidate)",
            "JSON validity pairs",
            "JSON validity (incumbent)",
            "JSON validity (candidate)",
            "refusal rate pairs",
            "refusal rate (incumbent)",
            "refusal rate (candidate)",
        ]
        return [
            {"day": day, **{c: row.get(c) for c in columns}} for day, row in sorted(days.items())
        ]

    def comparison(self) -> list[dict[str, Any]]:
        """One row per figure: each engine's share and the paired delta, with intervals."""
        rows = []
        probes = self.probes.get("engines") or {}
        for name, inc, cand, delta in (
            (
                "probe accuracy",
                (probes.get("incumbent") or {}).get("overall"),
                (probes.get("candidate") or {}).get("overall"),
                self.probes.get("delta"),
            ),
            (
                "JSON validity",
                self.json.get("incumbent"),
                self.json.get("candidate"),
                self.json.get("delta"),
            ),
            (
                "refusal rate",
                self.refusal.get("incumbent"),
                self.refusal.get("candidate"),
                self.refusal.get("delta"),
            ),
        ):
            d = delta or {}
            rows.append(
                {
                    "figure": name,
                    "incumbent": _iv(inc or {}),
                    "candidate": _iv(cand or {}),
                    "delta": {"value": d.get("value"), "low": d.get("low"), "high": d.get("high")},
                    "pairs": d.get("n", 0),
                    "design effect": d.get("deff"),
                }
            )
        return rows

    def accuracy_rows(self) -> list[dict[str, Any]]:
        rows = []
        for period in ("overall", "by_week", "by_day"):
            for role in ("incumbent", "candidate"):
                e = (self.probes.get("engines") or {}).get(role) or {}
                entries = [e.get("overall") or {}] if period == "overall" else e.get(period, [])
                for entry in entries:
                    label = entry.get("day") or entry.get("week") or "window"
                    rows.append(
                        {
                            "engine": role,
                            "period": label,
                            "answers": entry.get("n", 0),
                            "correct": entry.get("k", 0),
                            "accuracy": _iv(entry),
                        }
                    )
        return rows


def _iv(entry: dict[str, Any]) -> dict[str, Any]:
    """``{value, low, high}`` of a share entry (one report cell)."""
    return {"value": entry.get("rate"), "low": entry.get("low"), "high": entry.get("high")}


def _hour(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def _per_bucket(
    scored: Sequence[tuple[datetime, str, bool]], by: str, level: float
) -> list[dict[str, Any]]:
    buckets: dict[datetime, list[tuple[str, bool]]] = defaultdict(list)
    for ts, probe, ok in scored:
        buckets[bucket_start(ts, by)].append((probe, ok))  # type: ignore[arg-type]
    return [
        {by: bucket_label(start, by), **share(units, level)}  # type: ignore[arg-type]
        for start, units in sorted(buckets.items())
    ]


def probe_figures(
    pairs: dict[Any, _Pair], probe_set: ProbeSet, level: float
) -> tuple[dict[str, Any], list[Measurement]]:
    """Scores every probe answer; the per-engine and paired figures and their measurements."""
    scored: dict[str, list[tuple[datetime, str, bool]]] = {"incumbent": [], "candidate": []}
    by_kind: dict[tuple[str, str], list[tuple[str, bool]]] = defaultdict(list)
    failed = {"incumbent": 0, "candidate": 0}
    unscored = 0
    paired: list[tuple[Any, bool, bool]] = []
    for pair in pairs.values():
        results: dict[str, bool] = {}
        for role, side in pair.sides.items():
            probe = probe_set.lookup(side.probe_id or "")
            if probe is None:
                unscored += 1
                continue
            if side.status != "ok":
                failed[role] += 1
                continue
            ok = probe.check(side.text)
            results[role] = ok
            scored[role].append((pair.sent_at, probe.id, ok))
            by_kind[(role, probe.kind)].append((probe.id, ok))
        if len(results) == 2:
            pid = next(iter(pair.sides.values())).probe_id
            paired.append((pid, results["candidate"], results["incumbent"]))
    per_engine = {
        role: {
            "overall": share([(p, ok) for _, p, ok in rows], level),
            "by_day": _per_bucket(rows, "day", level),
            "by_week": _per_bucket(rows, "week", level),
            "failed": failed[role],
        }
        for role, rows in scored.items()
    }
    kinds = sorted({k for _, k in by_kind})
    delta, iv, info = paired_delta(paired, level)
    figures = {
        "engines": per_engine,
        "by_kind": [
            {
                "kind": kind,
                **{
                    role: share(by_kind.get((role, kind), []), level)
                    for role in ("incumbent", "candidate")
                },
            }
            for kind in kinds
        ],
        "delta": {"value": delta, "low": iv.low if iv else None, "high": iv.high if iv else None}
        | info,
        "unscored": unscored,
    }
    ms = [
        Measurement(
            "quality.probe.accuracy_delta",
            delta,
            iv,
            info["n"],
            "share",
            f"candidate minus incumbent accuracy on {info['n']} probes both answered;"
            f" Newcombe's paired interval on the effective n (design effect"
            f" {info.get('deff', 1.0):.2f}, clusters: probes)",
            "" if info["n"] else NO_PROBES,
            restate=_restate(info),
        )
    ]
    for role in ("candidate", "incumbent"):
        o: dict[str, Any] = per_engine[role]["overall"]  # type: ignore[assignment]
        ms.append(
            Measurement(
                f"quality.probe.{role}_accuracy",
                o["rate"],
                Interval(o["low"], o["high"], level) if o["rate"] is not None else None,
                o["n"],
                "share",
                f"{o['k']} of {o['n']} {role} probe answers correct; Wilson interval on the"
                " effective n",
            )
        )
    return figures, ms


def _by_day(units: list[tuple[Any, bool, bool]]) -> list[dict[str, Any]]:
    """Per UTC day of the units' hours: pairs and each side's share (no intervals: the window's
    delta carries the interval; a day is a look at the trend)."""
    days: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for hour, c, i in units:
        days[hour.date().isoformat()].append((c, i))
    return [
        {
            "day": day,
            "n": len(rows),
            "candidate": sum(c for c, _ in rows) / len(rows),
            "incumbent": sum(i for _, i in rows) / len(rows),
        }
        for day, rows in sorted(days.items())
    ]


def _paired_figure(
    units: list[tuple[Any, bool, bool]], level: float, key: str, what: str
) -> tuple[dict[str, Any], list[Measurement]]:
    delta, iv, info = paired_delta(units, level)
    sides = {
        "candidate": share([(c, x) for c, x, _ in units], level),
        "incumbent": share([(c, y) for c, _, y in units], level),
    }
    fig = {
        **sides,
        "delta": {"value": delta, "low": iv.low if iv else None, "high": iv.high if iv else None}
        | info,
        "by_day": _by_day(units),
    }
    ms = [
        Measurement(
            f"{key}_delta",
            delta,
            iv,
            info["n"],
            "share",
            f"candidate minus incumbent {what} on {info['n']} pairs both answered; Newcombe's"
            f" paired interval on the effective n (clusters: UTC hours)",
            restate=_restate(info),
        )
    ]
    for role, s in sides.items():
        ms.append(
            Measurement(
                f"{key.rsplit('.', 1)[0]}.{role}_{key.rsplit('.', 1)[1]}",
                s["rate"],
                Interval(s["low"], s["high"], level) if s["rate"] is not None else None,
                s["n"],
                "share",
                f"{s['k']} of {s['n']} {role} answers ({what}); Wilson interval",
            )
        )
    return fig, ms


def traffic_figures(
    pairs: dict[Any, _Pair], level: float
) -> tuple[dict[str, Any], dict[str, Any], list[Measurement]]:
    """Structured-output validity and refusal rate over sampled pairs of all traffic."""
    valid: list[tuple[Any, bool, bool]] = []
    refused: list[tuple[Any, bool, bool]] = []
    for pair in pairs.values():
        inc, cand = pair.sides.get("incumbent"), pair.sides.get("candidate")
        if inc is None or cand is None or inc.status != "ok" or cand.status != "ok":
            continue
        hour = _hour(pair.sent_at)
        vi = json_verdict(inc.request, inc.text)
        if vi is not None:
            vc = json_verdict(inc.request, cand.text)
            valid.append((hour, bool(vc), vi))
        refused.append((hour, is_refusal(cand.text), is_refusal(inc.text)))
    jf, jm = _paired_figure(valid, level, "quality.json.validity", "structured-output validity")
    rf, rm = _paired_figure(refused, level, "quality.refusal.rate", "refusal rate")
    return jf, rf, jm + rm


def _sampled_note(m: Measurement, read: int, total: int, config: QualityConfig) -> Measurement:
    """A probe measurement whose detail says it rests on a sample of the window's probe pairs."""
    note = (
        f" (a sample: {read:,} of the window's {total:,} probe pairs, at most"
        f" {config.max_sends_per_probe} sends of each probe, evenly spread over its sends)"
    )
    return replace(m, detail=m.detail + note)


def analyze_quality(
    engine: Engine,
    deployment: str,
    window: Window,
    config: QualityConfig | None = None,
    progress: Progress | None = None,
) -> QualitySection:
    """Probe accuracy, structured-output validity and refusal rate over ``window``."""
    config = config or QualityConfig()
    window = (as_utc(window[0]), as_utc(window[1]))
    probe_set = load_probe_set(config.probe_set)
    if progress is not None:
        progress("quality: probes", 0.0)
    if config.max_sends_per_probe is None:
        probe_pairs = _load_probes(engine, deployment, window)
        total = len(probe_pairs)
    else:
        probe_pairs, total = _load_probe_sample(
            engine, deployment, window, config.max_sends_per_probe
        )
    probes, pm = probe_figures(probe_pairs, probe_set, config.level)
    probes["sample"] = {
        "pairs read": len(probe_pairs),
        "pairs": total,
        "max sends per probe": config.max_sends_per_probe,
    }
    if total > len(probe_pairs):
        pm = [_sampled_note(m, len(probe_pairs), total, config) for m in pm]
    sample = _load_sample(engine, deployment, window, config.max_pairs_per_day, progress)
    sample.update(probe_pairs)  # every JSON probe counts for validity, whatever the sample
    js, rf, tm = traffic_figures(sample, config.level)
    return QualitySection(
        deployment,
        window,
        config,
        {"name": probe_set.name, "digest": probe_set.digest, "probes": len(probe_set)},
        probes,
        js,
        rf,
        pm + tm,
    )
