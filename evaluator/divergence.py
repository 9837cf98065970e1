"""Output divergence over a window: the candidate's divergence rate and its excess over the
incumbent-vs-replay noise floor (:class:`DivergenceSection`), from :func:`analyze_divergence`.

Each pair is compared by :func:`evaluator.compare.compare_pair` (pure, per pair; what the
metrics mean is said there), on a bounded sample of pairs per UTC day. No per-pair table is
stored: the metrics are computed on the fly from the sample
(``DivergenceConfig.max_pairs_per_day``, ``max_pairs``); text and a few request fields are read
for every sampled pair, logprobs only for greedy pairs whose texts differ.

Errors: none raised for odd data; a pair where either side failed (status not ok, or no text)
counts as not comparable.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import Any

import numpy as np
from scipy import stats
from sqlalchemy import Connection, Engine, func, literal, select, tablesample

from evaluator.compare import PairDivergence, PairSide, compare_pair
from evaluator.rates import newcombe_interval, wilson_interval
from evaluator.results import Interval, Measurement, Progress, Window
from shadow_ab.timestamps import as_utc
from storage.errors import translate
from storage.models import EXCHANGES

OTHER_ROLES: tuple[str, ...] = ("candidate", "replay")
SIMILARITY_EDGES: tuple[float, ...] = tuple(round(i * 0.05, 2) for i in range(21))
POSITION_EDGES: tuple[float, ...] = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, math.inf)


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
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, pair_id: str, d: PairDivergence) -> None:
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
            self.examples.append(
                {
                    "pair_id": pair_id,
                    "edit_similarity": d.edit_similarity,
                    "first_divergence": d.first_divergence,
                    "near_tie": d.near_tie,
                    "tokens": list(d.divergent_tokens),
                    "finish_reasons": list(d.finish_reasons),
                }
            )

    def rate(self, level: float) -> tuple[float | None, Interval | None]:
        if self.greedy == 0:
            return None, None
        return self.diverged / self.greedy, wilson_interval(self.diverged, self.greedy, level)

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
            "finish_mismatch": self.finish_mismatch,
            "finish_known": self.finish_known,
            "json_asked": self.json_asked,
            "json_invalid": self.json_invalid,
            "edit_similarity_mean": float(sim.mean()) if len(sim) else None,
            "length_ratio_median": (
                float(np.median(self.length_ratios)) if self.length_ratios else None
            ),
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

    def _excess(self, k1: int, n1: int, k2: int, n2: int) -> tuple[float | None, Interval | None]:
        if n1 == 0 or n2 == 0:
            return None, None
        return k1 / n1 - k2 / n2, newcombe_interval(k1, n1, k2, n2, self.config.level)

    def measurements(self) -> list[Measurement]:
        lv = self.config.level
        c, r = self.candidate, self.replay
        c_rate, c_iv = c.rate(lv)
        r_rate, r_iv = r.rate(lv)
        ex, ex_iv = self._excess(c.diverged, c.greedy, r.diverged, r.greedy)
        hard, hard_iv = self._excess(
            c.diverged - c.near_tie, c.greedy, r.diverged - r.near_tie, r.greedy
        )
        fm, fm_iv = self._excess(
            c.finish_mismatch, c.finish_known, r.finish_mismatch, r.finish_known
        )
        js, js_iv = self._excess(c.json_invalid, c.json_asked, r.json_invalid, r.json_asked)
        nt_iv = wilson_interval(c.near_tie, c.near_tie_known, lv)
        sim_mean = float(np.mean(c.similarity)) if c.similarity else None
        no_replay = "" if r.greedy else "; no replay pairs to judge the noise floor"
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
            Measurement(
                "divergence.excess_rate",
                ex,
                ex_iv,
                c.greedy + r.greedy,
                "share",
                "candidate rate minus the noise floor; Newcombe hybrid score interval" + no_replay,
            ),
            Measurement(
                "divergence.hard_excess_rate",
                hard,
                hard_iv,
                c.greedy + r.greedy,
                "share",
                "as excess_rate, counting only divergences that are not logprob near-ties"
                + no_replay,
            ),
            Measurement(
                "divergence.near_tie_share",
                c.near_tie / c.near_tie_known if c.near_tie_known else None,
                nt_iv,
                c.near_tie_known,
                "share",
                "candidate divergences where each side's token is in the other's top-k"
                " (of those with logprobs at the divergence); Wilson interval",
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
            Measurement(
                "divergence.finish_mismatch.excess",
                fm,
                fm_iv,
                c.finish_known + r.finish_known,
                "share",
                "finish-reason mismatch share, candidate minus replay; Newcombe interval"
                + no_replay,
            ),
            Measurement(
                "divergence.json_invalid.excess",
                js,
                js_iv,
                c.json_asked + r.json_asked,
                "share",
                "invalid-JSON share where JSON was asked, candidate minus replay; Newcombe"
                " interval" + ("" if c.json_asked else "; no request asked for JSON"),
            ),
        ]

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
                "sampling": "uniform random sample of pairs per UTC day (smallest pair ids)",
            },
            "candidate": self.candidate.summary(lv),
            "replay": self.replay.summary(lv),
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
            },
            "examples": {"worst": worst, "near_ties": near},
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


def sample_pair_ids(
    conn: Connection,
    deployment: str,
    role: str,
    lo: datetime,
    hi: datetime,
    limit: int,
    total: int,
) -> list[Any]:
    """Up to ``limit`` pair ids of ``role`` sent in ``[lo, hi)``, a random sample.

    Small days (and SQLite): the smallest pair ids (random UUIDs, so a uniform sample).
    Large days on PostgreSQL: ``TABLESAMPLE SYSTEM`` (random table blocks, twice as many as
    needed in expectation, ``REPEATABLE`` so a report is reproducible), so the cost follows the
    sample, not the day; rows of one block were written together, a mild clustering in time."""
    x = EXCHANGES.c
    if conn.dialect.name == "postgresql" and total > BLOCK_SAMPLE_FACTOR * limit:
        pct = min(100.0, 100.0 * 2.0 * limit / total)
        sampled = tablesample(EXCHANGES, func.system(pct), name="sampled", seed=literal(7))
        s = sampled.c
        q = (
            select(s.pair_id)
            .where(s.deployment == deployment, s.role == role, s.sent_at >= lo, s.sent_at < hi)
            .where(s.synthetic.is_(None))  # the mirror's probes: evaluator/quality.py
            .limit(limit)
        )
        return list(conn.execute(q).scalars())
    q = (
        select(x.pair_id)
        .where(x.deployment == deployment, x.role == role, x.sent_at >= lo, x.sent_at < hi)
        .where(x.synthetic.is_(None))
        .order_by(x.pair_id)
        .limit(limit)
    )
    return list(conn.execute(q).scalars())


def _compare_day(
    conn: Connection,
    deployment: str,
    role: str,
    lo: datetime,
    hi: datetime,
    limit: int,
    slack: timedelta,
    tally: _Tally,
) -> tuple[int, int, int]:
    """Sample ``role`` pairs sent in ``[lo, hi)``, compare them with their incumbent; return
    (total pairs, greedy compared, diverged) for the day table."""
    x = EXCHANGES.c
    total = conn.execute(
        select(func.count()).where(
            x.deployment == deployment,
            x.role == role,
            x.sent_at >= lo,
            x.sent_at < hi,
            x.synthetic.is_(None),
        )
    ).scalar_one()
    tally.total += int(total)
    if not total or limit <= 0:
        return int(total), 0, 0
    ids = sample_pair_ids(conn, deployment, role, lo, hi, limit, int(total))
    temperature = x.request["temperature"].as_float()
    fmt = x.request[("response_format", "type")].as_string()
    greedy0, diverged0 = tally.greedy, tally.diverged
    for chunk in _chunks(ids, 200):
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
            ).where(
                x.deployment == deployment,
                x.pair_id.in_(chunk),
                x.role.in_(("incumbent", role)),
                x.sent_at >= lo - slack,
                x.sent_at < hi + slack,
            )
        ).all()
        sides: dict[Any, dict[str, Any]] = defaultdict(dict)
        for r in rows:
            sides[r.pair_id][r.role] = r
        need_lp: list[Any] = []
        for pid in chunk:
            pair = sides.get(pid, {})
            if "incumbent" not in pair or role not in pair:
                continue
            a, b = pair["incumbent"], pair[role]
            if (
                a.has_lp
                and b.has_lp
                and a.output_text != b.output_text
                and a.temperature is not None
                and a.temperature == 0.0
                and a.status == "ok"
                and b.status == "ok"
            ):
                need_lp.append(pid)
        logprobs: dict[tuple[Any, str], Any] = {}
        if need_lp:
            for r in conn.execute(
                select(x.pair_id, x.role, x.logprobs).where(
                    x.deployment == deployment,
                    x.pair_id.in_(need_lp),
                    x.role.in_(("incumbent", role)),
                    x.sent_at >= lo - slack,
                    x.sent_at < hi + slack,
                )
            ):
                logprobs[(r.pair_id, r.role)] = r.logprobs
        for pid in chunk:
            pair = sides.get(pid, {})
            if "incumbent" not in pair or role not in pair:
                tally.sampled += 1  # a pair without its incumbent answer: not comparable
                continue
            a, b = pair["incumbent"], pair[role]
            request = _request_of(a)
            inc = PairSide.from_row(
                {**a._mapping, "request": request, "logprobs": logprobs.get((pid, "incumbent"))}
            )
            oth = PairSide.from_row(
                {**b._mapping, "request": request, "logprobs": logprobs.get((pid, role))}
            )
            tally.add(str(pid), compare_pair(inc, oth))
    return int(total), tally.greedy - greedy0, tally.diverged - diverged0


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
    ``config.max_pairs_per_day`` pairs per UTC day and role (``config.max_pairs`` in all)."""
    lo, hi = as_utc(window[0]), as_utc(window[1])
    if hi <= lo:
        raise ValueError(f"window end {hi.isoformat()} is not after its start {lo.isoformat()}")
    days = _days(lo, hi)
    per_day_limit = min(config.max_pairs_per_day, max(1, config.max_pairs // max(1, len(days))))
    tallies = {role: _Tally() for role in OTHER_ROLES}
    table: list[dict[str, Any]] = []
    with translate(), engine.connect() as conn:
        for i, (d0, d1) in enumerate(days):
            if progress is not None:
                progress(f"divergence {d0.date().isoformat()}", i / len(days))
            row: dict[str, Any] = {"day": d0.date().isoformat()}
            for role in OTHER_ROLES:
                total, greedy, diverged = _compare_day(
                    conn,
                    deployment,
                    role,
                    d0,
                    d1,
                    per_day_limit,
                    config.replay_slack,
                    tallies[role],
                )
                row[role] = {
                    "pairs": total,
                    "greedy_compared": greedy,
                    "diverged": diverged,
                    "rate": diverged / greedy if greedy else None,
                }
            table.append(row)
    if progress is not None:
        progress("divergence done", 1.0)
    return DivergenceSection(
        deployment, (lo, hi), config, tallies["candidate"], tallies["replay"], table
    )
