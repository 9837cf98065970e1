"""Output divergence over a window: the candidate's divergence rate and its excess over the
incumbent-vs-replay noise floor (:class:`DivergenceSection`), from :func:`analyze_divergence`.

The excess is estimated on **triads**: sampled requests that have a replay *and* a candidate
answer, so the candidate and the floor are judged on the same requests with a paired interval
(:mod:`evaluator.paired`). Divergences are split by the logprob margin at the first divergence
(:func:`evaluator.compare.divergence_margin`): near ties (within ``near_tie_nats``) and hard
ones; hard divergences, the finish-reason mismatch and the length shift are what a policy
judges, exact-match excess is information (``evaluator/README.md``, "Divergence").

Each pair is compared by :func:`evaluator.compare.compare_pair` (pure, per pair; what the
metrics mean is said there), on a bounded sample of pairs per UTC day. No per-pair table is
stored: the metrics are computed on the fly from the sample
(``DivergenceConfig.max_pairs_per_day``, ``max_pairs``); text and a few request fields are read
for every sampled pair, logprobs only for greedy pairs whose texts differ.

Errors: none raised for odd data; a pair where either side failed (status not ok, or no text)
counts as not comparable.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, time, timedelta
from functools import partial
from typing import Any
from urllib.parse import quote

import numpy as np
from scipy import stats
from sqlalchemy import Connection, Engine, func, literal, select, tablesample, true

from evaluator.compare import NEAR_TIE_NATS, PairDivergence, PairSide, compare_pair
from evaluator.exchange_rollups import role_extent
from evaluator.paired import PairedEstimate, paired_mean_difference, paired_share_difference
from evaluator.rates import newcombe_interval, wilson_interval
from evaluator.results import Interval, Measurement, Progress, Window
from shadow_ab.timestamps import as_utc
from storage.errors import translate
from storage.models import EXCHANGES, client_traffic

OTHER_ROLES: tuple[str, ...] = ("candidate", "replay")
SIMILARITY_EDGES: tuple[float, ...] = tuple(round(i * 0.05, 2) for i in range(21))
POSITION_EDGES: tuple[float, ...] = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, math.inf)
MARGIN_EDGES: tuple[float, ...] = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, math.inf)


@dataclass(frozen=True)
class DivergenceConfig:
    """How many pairs the analysis reads (it never loads a whole month)."""

    max_pairs_per_day: int = 300
    """Pairs sampled per UTC day and role (candidate, replay): a uniform random sample (the
    smallest pair ids, which are random UUIDs)."""
    max_pairs: int = 6000
    """Cap over the whole window per role; the per-day sample shrinks to fit it."""
    examples: int = 10
    level: float = 0.95
    replay_slack: timedelta = timedelta(hours=1)
    """How long after its incumbent a replay or candidate exchange may have been sent."""
    near_tie_nats: float = NEAR_TIE_NATS
    """A divergence is a near tie when the logprob margin at its first token is within this."""
    api_base_url: str = ""
    """Prefix of the links to the query API's pair view in the report (``""``: links relative
    to the API's root, ``/v1/deployments/...``)."""
    example_chars: int = 160
    """Characters of each side's text shown around the first divergence of the worst pairs
    (0: none in the report, the link only)."""
    near_tie_source: str = "the analysis' default"
    """Where ``near_tie_nats`` came from, for the report's method text (the review sets it to
    the policy's ``near_tie_nats``)."""


@dataclass
class _Tally:
    """Per-role counts of compared pairs."""

    sampled: int = 0
    total: int = 0
    comparable: int = 0
    greedy: int = 0
    diverged: int = 0
    near_tie: int = 0
    near_tie_known: int = 0
    finish_known: int = 0
    finish_mismatch: int = 0
    json_asked: int = 0
    json_invalid: int = 0
    similarity: list[float] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    length_ratios: list[float] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def hard(self) -> int:
        """Divergences not known to be near ties (an unknown margin counts as hard)."""
        return self.diverged - self.near_tie

    def add(
        self,
        pair_id: str,
        d: PairDivergence,
        texts: tuple[str | None, str | None] = (None, None),
        example_chars: int = 0,
    ) -> None:
        self.sampled += 1
        if not d.comparable:
            return
        self.comparable += 1
        if d.edit_similarity is not None:
            self.similarity.append(d.edit_similarity)
        if d.length_ratio is not None:
            self.length_ratios.append(d.length_ratio)
        if d.finish_mismatch is not None:
            self.finish_known += 1
            self.finish_mismatch += d.finish_mismatch
        if d.json_asked:
            self.json_asked += 1
            self.json_invalid += d.json_valid_other is False
        if d.greedy:
            self.greedy += 1
        if d.diverged:
            self.diverged += 1
            if d.first_divergence is not None:
                self.positions.append(d.first_divergence)
            if d.near_tie is not None:
                self.near_tie_known += 1
                self.near_tie += d.near_tie
            if d.margin is not None:
                self.margins.append(d.margin)
            example: dict[str, Any] = {
                "pair_id": pair_id,
                "edit_similarity": d.edit_similarity,
                "first_divergence": d.first_divergence,
                "near_tie": d.near_tie,
                "margin": d.margin,
                "margin_bound": d.margin_bound,
                "tokens": list(d.divergent_tokens),
                "finish_reasons": list(d.finish_reasons),
                "length_ratio": d.length_ratio,
            }
            if example_chars > 0:
                # Content: the query API nulls these keys (api/redact.py) without the scope.
                example["incumbent_text"], example["candidate_text"] = excerpts(
                    *texts, example_chars
                )
            self.examples.append(example)

    def merge(self, other: _Tally) -> None:
        for name in (
            "sampled",
            "total",
            "comparable",
            "greedy",
            "diverged",
            "near_tie",
            "near_tie_known",
            "finish_known",
            "finish_mismatch",
            "json_asked",
            "json_invalid",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("similarity", "positions", "length_ratios", "margins", "examples"):
            getattr(self, name).extend(getattr(other, name))

    def rate(self, level: float) -> tuple[float | None, Interval | None]:
        if self.greedy == 0:
            return None, None
        return self.diverged / self.greedy, wilson_interval(self.diverged, self.greedy, level)

    def day_figures(self) -> dict[str, Any]:
        """The per-day row's figures for this role (points only)."""
        g = self.greedy
        return {
            "pairs": self.total,
            "greedy_compared": g,
            "diverged": self.diverged,
            "rate": self.diverged / g if g else None,
            "hard_rate": self.hard / g if g else None,
            "near_tie_share": self.near_tie / self.diverged if self.diverged else None,
            "finish_mismatch": (
                self.finish_mismatch / self.finish_known if self.finish_known else None
            ),
            "length_ratio_median": (
                float(np.median(self.length_ratios)) if self.length_ratios else None
            ),
        }

    def summary(self, level: float) -> dict[str, Any]:
        rate, iv = self.rate(level)
        sim = np.asarray(self.similarity, dtype=float)
        return {
            "pairs_total": self.total,
            "pairs_sampled": self.sampled,
            "comparable": self.comparable,
            "greedy": self.greedy,
            "diverged": self.diverged,
            "rate": rate,
            "interval": iv.to_dict() if iv else None,
            "near_tie": self.near_tie,
            "near_tie_known": self.near_tie_known,
            "hard": self.hard,
            "finish_mismatch": self.finish_mismatch,
            "finish_known": self.finish_known,
            "json_asked": self.json_asked,
            "json_invalid": self.json_invalid,
            "edit_similarity_mean": float(sim.mean()) if len(sim) else None,
            "length_ratio_median": (
                float(np.median(self.length_ratios)) if self.length_ratios else None
            ),
        }


def excerpts(a: str | None, b: str | None, chars: int) -> tuple[str | None, str | None]:
    """Both texts from a little before their first differing character, ``chars`` long (an
    ellipsis marks what was cut); None for a missing text."""
    if a is None or b is None:
        return a and a[:chars], b and b[:chars]
    n = min(len(a), len(b))
    c = 0
    while c < n and a[c] == b[c]:
        c += 1
    start = max(0, c - chars // 4)

    def cut(t: str) -> str:
        body = t[start : start + chars]
        return ("…" if start else "") + body + ("…" if start + chars < len(t) else "")

    return cut(a), cut(b)


@dataclass
class _Triads:
    """Requests with incumbent, candidate and replay answers: the paired comparison."""

    day: list[str] = field(default_factory=list)
    """UTC day of each greedy comparable triad (the cluster)."""
    cand_div: list[bool] = field(default_factory=list)
    replay_div: list[bool] = field(default_factory=list)
    cand_hard: list[bool] = field(default_factory=list)
    replay_hard: list[bool] = field(default_factory=list)
    finish_day: list[str] = field(default_factory=list)
    cand_finish: list[bool] = field(default_factory=list)
    replay_finish: list[bool] = field(default_factory=list)
    length_day: list[str] = field(default_factory=list)
    length_shift: list[float] = field(default_factory=list)
    """log(candidate length / replay length) per triad (both lengths known and positive)."""

    def add(self, day: str, c: PairDivergence, r: PairDivergence) -> None:
        if not (c.comparable and r.comparable):
            return
        if c.greedy:
            self.day.append(day)
            self.cand_div.append(c.diverged)
            self.replay_div.append(r.diverged)
            self.cand_hard.append(c.diverged and c.near_tie is not True)
            self.replay_hard.append(r.diverged and r.near_tie is not True)
        if c.finish_mismatch is not None and r.finish_mismatch is not None:
            self.finish_day.append(day)
            self.cand_finish.append(c.finish_mismatch)
            self.replay_finish.append(r.finish_mismatch)
        if c.length_ratio and r.length_ratio:
            self.length_day.append(day)
            self.length_shift.append(math.log(c.length_ratio / r.length_ratio))

    def merge(self, other: _Triads) -> None:
        for name in self.__dataclass_fields__:
            getattr(self, name).extend(getattr(other, name))

    def figures(self) -> dict[str, Any]:
        """Points for a per-day row."""
        n = len(self.day)

        def share(xs: list[bool]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        def diff(xs: list[bool], ys: list[bool]) -> float | None:
            return (sum(xs) - sum(ys)) / len(xs) if xs else None

        return {
            "n": n,
            "excess": diff(self.cand_div, self.replay_div),
            "hard_excess": diff(self.cand_hard, self.replay_hard),
            "finish_excess": diff(self.cand_finish, self.replay_finish),
            "length_shift": float(np.mean(self.length_shift)) if self.length_shift else None,
            "candidate_rate": share(self.cand_div),
            "replay_rate": share(self.replay_div),
        }


def _histogram(values: Sequence[float], edges: Sequence[float]) -> list[int]:
    if not values:
        return [0] * (len(edges) - 1)
    counts, _ = np.histogram(np.asarray(values, dtype=float), bins=np.asarray(edges, dtype=float))
    return [int(c) for c in counts]


def _mean_interval(values: Sequence[float], level: float) -> Interval | None:
    n = len(values)
    if n < 2:
        return None
    arr = np.asarray(values, dtype=float)
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * float(arr.std(ddof=1)) / math.sqrt(n)
    mean = float(arr.mean())
    return Interval(max(0.0, mean - half), min(1.0, mean + half), level)


@dataclass
class DivergenceSection:
    """Output divergence of one deployment over one window (:func:`analyze_divergence`)."""

    deployment: str
    window: Window
    config: DivergenceConfig
    candidate: _Tally
    replay: _Tally
    per_day: list[dict[str, Any]]
    triads: _Triads = field(default_factory=_Triads)

    def _excess(self, k1: int, n1: int, k2: int, n2: int) -> tuple[float | None, Interval | None]:
        if n1 == 0 or n2 == 0:
            return None, None
        return k1 / n1 - k2 / n2, newcombe_interval(k1, n1, k2, n2, self.config.level)

    def _paired(
        self, key: str, est: PairedEstimate | None, what: str, unit: str = "share"
    ) -> Measurement:
        lv = self.config.level
        if est is None:
            why = (
                "no replay pairs to judge the noise floor"
                if not self.replay.sampled
                else "no triads (requests with both a replay and a candidate answer)"
            )
            return Measurement(key, None, None, 0, unit, f"{what}; {why}")
        deff = (
            f", widened by the day design effect {est.design_effect:.2f}"
            if est.design_effect > 1.0
            else ""
        )
        method = "Newcombe paired interval" if unit == "share" else "t interval"
        return Measurement(
            key,
            est.value,
            est.interval if est.interval is None else replace(est.interval, level=lv),
            est.n,
            unit,
            f"{what}, on {est.n} triads (requests answered by the incumbent, the candidate and"
            f" the replay); {method}{deff}",
            restate=est.restate,
        )

    def measurements(self) -> list[Measurement]:
        lv = self.config.level
        c, r, t = self.candidate, self.replay, self.triads
        c_rate, c_iv = c.rate(lv)
        r_rate, r_iv = r.rate(lv)
        js, js_iv = self._excess(c.json_invalid, c.json_asked, r.json_invalid, r.json_asked)
        nt_iv = wilson_interval(c.near_tie, c.diverged, lv)
        sim_mean = float(np.mean(c.similarity)) if c.similarity else None
        no_replay = "" if r.greedy else "; no replay pairs to judge the noise floor"
        nats = self.config.near_tie_nats
        return [
            Measurement(
                "divergence.candidate_rate",
                c_rate,
                c_iv,
                c.greedy,
                "share",
                f"{c.diverged} of {c.greedy} greedy candidate pairs differ from the incumbent"
                f" (sample of {c.sampled} of {c.total} pairs); Wilson interval",
            ),
            Measurement(
                "divergence.noise_rate",
                r_rate,
                r_iv,
                r.greedy,
                "share",
                f"{r.diverged} of {r.greedy} greedy replay pairs differ from the incumbent (the"
                " incumbent against itself); Wilson interval" + no_replay,
            ),
            self._paired(
                "divergence.excess_rate",
                paired_share_difference(t.cand_div, t.replay_div, t.day, lv),
                "exact-match divergence, candidate minus replay (information: a change of"
                " kernels flips near ties without being worse)",
            ),
            self._paired(
                "divergence.hard_excess_rate",
                paired_share_difference(t.cand_hard, t.replay_hard, t.day, lv),
                f"divergences that are not near ties (logprob margin above {nats:g} nats at"
                " the first divergence, or unknown), candidate minus replay",
            ),
            Measurement(
                "divergence.near_tie_share",
                c.near_tie / c.diverged if c.diverged else None,
                nt_iv,
                c.diverged,
                "share",
                f"candidate divergences whose logprob margin at the first divergence is within"
                f" {nats:g} nats ({c.near_tie_known} of {c.diverged} with a known margin);"
                " Wilson interval",
            ),
            Measurement(
                "divergence.edit_similarity.mean",
                sim_mean,
                _mean_interval(c.similarity, lv),
                len(c.similarity),
                "share",
                "mean normalized token edit similarity of comparable candidate pairs"
                " (1 = identical); t interval",
            ),
            self._paired(
                "divergence.finish_mismatch.excess",
                paired_share_difference(t.cand_finish, t.replay_finish, t.finish_day, lv),
                "finish-reason mismatch with the incumbent (stop vs length), candidate minus"
                " replay",
            ),
            Measurement(
                "divergence.json_invalid.excess",
                js,
                js_iv,
                c.json_asked + r.json_asked,
                "share",
                "invalid-JSON share where JSON was asked, candidate minus replay; Newcombe"
                " interval" + ("" if c.json_asked else "; no request asked for JSON"),
                restate=None
                if js_iv is None
                else partial(
                    newcombe_interval, c.json_invalid, c.json_asked, r.json_invalid, r.json_asked
                ),
            ),
            self._paired(
                "divergence.length_shift",
                paired_mean_difference(t.length_shift, t.length_day, lv),
                "mean log(candidate length / replay length) in completion tokens (-0.1: the"
                " candidate's answers about 10 % shorter than the incumbent's own repeat)",
                unit="log ratio",
            ),
        ]

    def worst_pairs(self) -> list[dict[str, Any]]:
        """The worst candidate divergences side by side: hard ones first, least similar first,
        each with a link to the query API's pair view."""
        ordered = sorted(
            self.candidate.examples,
            key=lambda e: (e["near_tie"] is True, e["edit_similarity"] or 0.0),
        )[: self.config.examples]
        base = self.config.api_base_url.rstrip("/")
        dep = quote(self.deployment, safe="")
        out = []
        for e in ordered:
            row = {
                "pair_id": e["pair_id"],
                "kind": "near tie" if e["near_tie"] else "hard",
                "margin": e["margin"],
                "edit_similarity": e["edit_similarity"],
                "first_divergence": e["first_divergence"],
                "finish": " / ".join(str(f) for f in e["finish_reasons"]),
                "length_ratio": e["length_ratio"],
            }
            if "incumbent_text" in e:
                row["incumbent_text"] = e["incumbent_text"]
                row["candidate_text"] = e["candidate_text"]
            row["link"] = f"{base}/v1/deployments/{dep}/pairs/{e['pair_id']}?format=html"
            out.append(row)
        return out

    def to_dict(self) -> dict[str, Any]:
        lv = self.config.level
        worst = sorted(
            self.candidate.examples,
            key=lambda e: (e["near_tie"] is True, e["edit_similarity"] or 0.0),
        )[: self.config.examples]
        near = [e for e in self.candidate.examples if e["near_tie"]][: self.config.examples]
        return {
            "deployment": self.deployment,
            "window": {"from": self.window[0].isoformat(), "to": self.window[1].isoformat()},
            "config": {
                "max_pairs_per_day": self.config.max_pairs_per_day,
                "max_pairs": self.config.max_pairs,
                "level": lv,
                "near_tie_nats": self.config.near_tie_nats,
                "near ties": f"a divergence is a near tie when the logprob margin at its first"
                f" token is within {self.config.near_tie_nats:g} nats"
                f" ({self.config.near_tie_source}); hard otherwise or when unknown, judged by"
                " divergence.hard_excess_rate",
                "sampling": "uniform random sample of pairs per UTC day (smallest pair ids;"
                " large PostgreSQL days: sampled table blocks, ordered by pair id)",
            },
            "candidate": self.candidate.summary(lv),
            "replay": self.replay.summary(lv),
            "triads": self.triads.figures(),
            "per_day": self.per_day,
            "histograms": {
                "edit_similarity": {
                    "edges": list(SIMILARITY_EDGES),
                    "candidate": _histogram(self.candidate.similarity, SIMILARITY_EDGES),
                    "replay": _histogram(self.replay.similarity, SIMILARITY_EDGES),
                },
                "first_divergence": {
                    "edges": [e if math.isfinite(e) else None for e in POSITION_EDGES],
                    "candidate": _histogram(self.candidate.positions, POSITION_EDGES),
                    "replay": _histogram(self.replay.positions, POSITION_EDGES),
                },
                "margin": {
                    "edges": [e if math.isfinite(e) else None for e in MARGIN_EDGES],
                    "candidate": _histogram(self.candidate.margins, MARGIN_EDGES),
                    "replay": _histogram(self.replay.margins, MARGIN_EDGES),
                },
            },
            "examples": {"worst": worst, "near_ties": near},
            "worst_pairs": self.worst_pairs(),
            "measurements": [m.to_dict() for m in self.measurements()],
        }


def _days(lo: datetime, hi: datetime) -> list[tuple[datetime, datetime]]:
    out = []
    d = datetime.combine(lo.date(), time.min, tzinfo=UTC)
    while d < hi:
        nxt = d + timedelta(days=1)
        out.append((max(d, lo), min(nxt, hi)))
        d = nxt
    return out


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


BLOCK_SAMPLE_FACTOR = 4
"""PostgreSQL samples table blocks when a day holds more than this many times the pairs wanted
(reading every row for its pair id would cost a scan of the day's wide rows)."""


def sample_seed(deployment: str, day: datetime) -> int:
    """The seed of a day's block sample: a function of the deployment and the UTC day alone
    (not of the window, nor of how many reviews ran), so every review of the day draws the
    same blocks."""
    key = f"{deployment}/{as_utc(day).date().isoformat()}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little") & 0x7FFFFFFF


def sample_pair_ids(
    conn: Connection,
    deployment: str,
    role: str,
    lo: datetime,
    hi: datetime,
    limit: int,
    total: int,
    *,
    probes: bool = False,
) -> list[Any]:
    """Up to ``limit`` pair ids of ``role`` sent in ``[lo, hi)``, a random sample of client
    traffic (``probes``: the mirror's probes too).

    Small days (and SQLite): the smallest pair ids (random UUIDs, so a uniform sample).
    Large days on PostgreSQL: ``TABLESAMPLE SYSTEM`` (random table blocks, twice as many rows
    as needed in expectation, ``REPEATABLE`` with a seed of the deployment and day,
    :func:`sample_seed`, so every review of the day draws the same sample), so the cost follows
    the sample, not the day; the sampled rows are **ordered by pair id before the limit**, so
    the sample is drawn from every sampled block across the day (without the ordering the limit
    kept the first blocks in table order: the day's early hours). Rows of one block were
    written together, a mild clustering in time."""
    x = EXCHANGES.c
    if conn.dialect.name == "postgresql" and total > BLOCK_SAMPLE_FACTOR * limit:
        pct = min(100.0, 100.0 * 2.0 * limit / total)
        seed = sample_seed(deployment, lo)
        sampled = tablesample(EXCHANGES, func.system(pct), name="sampled", seed=literal(seed))
        s = sampled.c
        q = (
            select(s.pair_id)
            .where(s.deployment == deployment, s.role == role, s.sent_at >= lo, s.sent_at < hi)
            .where(client_traffic(sampled) if not probes else true())
            .order_by(s.pair_id)
            .limit(limit)
        )
        return list(conn.execute(q).scalars())
    q = (
        select(x.pair_id)
        .where(x.deployment == deployment, x.role == role, x.sent_at >= lo, x.sent_at < hi)
        .where(client_traffic() if not probes else true())
        .order_by(x.pair_id)
        .limit(limit)
    )
    return list(conn.execute(q).scalars())


def _load_sides(
    conn: Connection,
    deployment: str,
    ids: Sequence[Any],
    roles: tuple[str, ...],
    lo: datetime,
    hi: datetime,
    slack: timedelta,
) -> dict[Any, dict[str, PairSide]]:
    """The answers of ``roles`` (the incumbent's first) to the pairs ``ids``, as the comparison
    needs them: text and two request fields for all, logprobs only where a greedy other side's
    text differs from the incumbent's (both sides' then)."""
    x = EXCHANGES.c
    temperature = x.request["temperature"].as_float()
    fmt = x.request[("response_format", "type")].as_string()
    where = (
        x.deployment == deployment,
        x.pair_id.in_(ids),
        x.role.in_(roles),
        x.sent_at >= lo - slack,
        x.sent_at < hi + slack,
    )
    rows = conn.execute(
        select(
            x.pair_id,
            x.role,
            x.status,
            x.output_text,
            x.finish_reason,
            x.completion_tokens,
            temperature.label("temperature"),
            fmt.label("fmt"),
            x.logprobs.is_not(None).label("has_lp"),
        ).where(*where)
    ).all()
    raw: dict[Any, dict[str, Any]] = defaultdict(dict)
    for r in rows:
        raw[r.pair_id][r.role] = r
    need: set[tuple[Any, str]] = set()
    for pid, pair in raw.items():
        a = pair.get("incumbent")
        if a is None or a.status != "ok" or a.temperature is None or a.temperature != 0.0:
            continue
        for role, b in pair.items():
            if role != "incumbent" and b.status == "ok" and b.output_text != a.output_text:
                if b.has_lp:
                    need.add((pid, role))
                if a.has_lp:
                    need.add((pid, "incumbent"))
    logprobs: dict[tuple[Any, str], Any] = {}
    if need:
        want = sorted({pid for pid, _ in need}, key=str)
        for chunk in _chunks(want, 200):
            for r in conn.execute(
                select(x.pair_id, x.role, x.logprobs).where(
                    *where[:1], x.pair_id.in_(chunk), *where[2:]
                )
            ):
                if (r.pair_id, r.role) in need:
                    logprobs[(r.pair_id, r.role)] = r.logprobs
    out: dict[Any, dict[str, PairSide]] = {}
    for pid, pair in raw.items():
        if "incumbent" not in pair:
            continue
        request = _request_of(pair["incumbent"])
        out[pid] = {
            role: PairSide.from_row(
                {**row._mapping, "request": request, "logprobs": logprobs.get((pid, role))}
            )
            for role, row in pair.items()
        }
    return out


def _compare_day(
    conn: Connection,
    deployment: str,
    role: str,
    lo: datetime,
    hi: datetime,
    limit: int,
    config: DivergenceConfig,
) -> tuple[_Tally, _Triads]:
    """Sample ``role`` pairs sent in ``[lo, hi)`` and compare them with their incumbent; for
    replay pairs, compare their candidate too (the triads)."""
    tally, triads = _Tally(), _Triads()
    total, _, _ = role_extent(conn, deployment, (role,), (lo, hi))  # rollups where closed
    tally.total = int(total)
    if not total or limit <= 0:
        return tally, triads
    ids = sample_pair_ids(conn, deployment, role, lo, hi, limit, int(total))
    roles = ("incumbent", role, "candidate") if role == "replay" else ("incumbent", role)
    day = lo.date().isoformat()
    nats = config.near_tie_nats
    for chunk in _chunks(ids, 200):
        sides = _load_sides(conn, deployment, chunk, roles, lo, hi, config.replay_slack)
        for pid in chunk:
            pair = sides.get(pid, {})
            if role not in pair:
                tally.sampled += 1  # a pair without its incumbent answer: not comparable
                continue
            inc, oth = pair["incumbent"], pair[role]
            d = compare_pair(inc, oth, near_tie_nats=nats)
            tally.add(str(pid), d, (inc.text, oth.text), config.example_chars)
            if role == "replay" and "candidate" in pair:
                triads.add(day, compare_pair(inc, pair["candidate"], near_tie_nats=nats), d)
    return tally, triads


def _request_of(row: Any) -> dict[str, Any]:
    """The request fields the comparison reads (extracted in SQL: the body may be large)."""
    req: dict[str, Any] = {}
    if row.temperature is not None:
        req["temperature"] = row.temperature
    if row.fmt is not None:
        req["response_format"] = {"type": row.fmt}
    return req


def analyze_divergence(
    engine: Engine,
    deployment: str,
    window: Window,
    config: DivergenceConfig = DivergenceConfig(),
    progress: Progress | None = None,
) -> DivergenceSection:
    """Candidate-vs-incumbent and replay-vs-incumbent divergence over ``window``, on at most
    ``config.max_pairs_per_day`` pairs per UTC day and role (``config.max_pairs`` in all); the
    excess on the sampled replay pairs that have a candidate answer (triads)."""
    lo, hi = as_utc(window[0]), as_utc(window[1])
    if hi <= lo:
        raise ValueError(f"window end {hi.isoformat()} is not after its start {lo.isoformat()}")
    days = _days(lo, hi)
    per_day_limit = min(config.max_pairs_per_day, max(1, config.max_pairs // max(1, len(days))))
    tallies = {role: _Tally() for role in OTHER_ROLES}
    triads = _Triads()
    table: list[dict[str, Any]] = []
    with translate(), engine.connect() as conn:
        for i, (d0, d1) in enumerate(days):
            if progress is not None:
                progress(f"divergence {d0.date().isoformat()}", i / len(days))
            row: dict[str, Any] = {"day": d0.date().isoformat()}
            for role in OTHER_ROLES:
                tally, day_triads = _compare_day(
                    conn, deployment, role, d0, d1, per_day_limit, config
                )
                row[role] = tally.day_figures()
                tallies[role].merge(tally)
                if role == "replay":
                    row["triads"] = day_triads.figures()
                    triads.merge(day_triads)
            table.append(row)
    if progress is not None:
        progress("divergence done", 1.0)
    return DivergenceSection(
        deployment, (lo, hi), config, tallies["candidate"], tallies["replay"], table, triads
    )
