"""Generated months of review data, independent or clustered as month-long production data is,
for A/A (identical engines) and for real effects. Pure numpy, seeded; no store.

Used by ``bench/verdict_validity.py`` and ``tests/evaluator/test_verdict_months.py`` through
:mod:`shadow_ab.dev.verdict_months`, which looks at each month every day with the evaluator's
own interval functions and verdict. A month holds, per role (incumbent, candidate; replay for
divergence), what those functions read at a look: the review's latency sample of pairs per
hour, failed and sent exchanges per day, crash incidents per day, divergent pairs per day.

What a generated month assumes (so a reader can question it):

- **Latency (TTFT)**, per pair: ``log TTFT = log(median) + load(hour) + request + own`` for each
  engine. ``load(hour)``: a daily cycle (sd ``load_sd`` over the day) plus an hour-to-hour
  wobble, the same for both engines (they serve the same traffic at the same time);
  ``request``: the prompt's and the batch's effect, shared by the pair (sd ``request_sd``);
  ``own``: each engine's own noise per request (sd ``own_sd``). *Clustered* adds effects of
  each engine of its own per hour (sd ``engine_hour_sd``) and per day (sd ``engine_day_sd``):
  a noisy neighbour, a slow node, a config push, which hit one engine and not the other for
  an hour or a day. A/A months draw both engines from the same model; the effect multiplies
  the candidate's TTFT by ``ttft_factor`` (1.12: p95 12 % slower). The review's sample is
  mimicked: every hour keeps ``pairs_per_hour`` pairs in random order and a look at day ``d``
  takes the first ``latency_pairs / (24 d)`` of each hour (at most 40 000 in all, the
  review's ``max_pairs``). Not modelled: drift over weeks, slowdowns that depend on the
  engine's own load, tails heavier than log-normal, hours of a day correlated beyond the
  shared daily cycle.
- **Failed exchanges**: each engine sends ``exchanges_per_day`` a day and fails each with
  probability ``error_share``, independently (*independent*); *clustered* adds error bursts per
  engine, a Poisson process of rate uniform in ``bursts_per_day`` (0.05-0.2 a day), each of
  Poisson(``burst_failures``, 20) failures, on top of a base rate lowered to keep the same
  mean. Both engines alike in every scenario but ``failure_factor``'s (the candidate's mean
  rate times it, bursts alike, the extra on its base rate: ``AT_THRESHOLD``). Bursts never span
  midnight (the per-day overdispersion sees each one whole).
- **Crashes**, per day: restarts (``crashes``: the incidents detection reports, one per
  restart) and episodes (``episodes``: what ``incidents.<kind>.rate_ratio`` compares, restarts
  within 30 minutes of the previous one being one episode). *Independent*: restarts a Poisson
  process of ``crashes_per_day`` (0.75) per engine, each its own episode (two within 30 minutes,
  about 1 % of them, are not merged); *clustered*: crash-loop episodes, a Poisson process of
  rate ``crashes_per_day / (1 + mean loop)`` (0.1 a day; mean loop 6.5), each of 1 + Poisson(m)
  restarts with m uniform in ``loop_restarts`` (4-9) per month and engine: the same restarts,
  far more spread (identical engines have the same episode rate; their loop lengths differ).
  Days independent; one rate per engine over the month (no bad week). The effect multiplies the
  candidate's rate (of episodes when clustered) by ``crash_factor`` (3). At 0.1 episodes a day a
  month holds ~3 incumbent and ~9 candidate episodes: too few for any test to tell 3x from the
  threshold of 2 (the bench's power curve against the base rate shows what it takes).
- **Divergence**: each day the analysis reads ``divergence_pairs_per_day`` candidate pairs and
  as many replay pairs (300; 6 000 over the window at most, the per-day sample shrinking to
  fit); each diverges with the day's rate. *Independent*: the candidate's and the replay's
  rates are the noise floor ``noise_floor`` (3 %) every day. *Clustered*: each role's daily rate
  varies (logit sd ``divergence_day_sd`` 0.3: the day's prompt mix), and the replay floor sits
  low by a month's ``floor_gap`` (uniform 0-1.5 points: replays go out later than the
  candidate's request, at another batch mix). A gap above the criterion's threshold (2 points)
  is a real excess by the criterion's definition: no interval can call it A/A. The effect adds
  ``divergence_excess`` (5 points) to the candidate's rate.
- Memory and leaks are not generated here: ``tests/evaluator/memory_months.py`` has the
  memory months (AR(1) noise, daily cycle, restarts, refill) and ``bench/leak_validity.py``
  their bench.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

ROLES = ("incumbent", "candidate")


@dataclass(frozen=True)
class Effects:
    """What differs between the engines (all neutral: an A/A month)."""

    ttft_factor: float = 1.0
    crash_factor: float = 1.0
    divergence_excess: float = 0.0
    failure_factor: float = 1.0
    """The candidate's mean failure rate over the incumbent's (its bursts alike, the extra on
    its base rate)."""

    @property
    def name(self) -> str:
        parts = []
        if self.ttft_factor != 1.0:
            parts.append(f"TTFT x{self.ttft_factor:g}")
        if self.crash_factor != 1.0:
            parts.append(f"crashes x{self.crash_factor:g}")
        if self.failure_factor != 1.0:
            parts.append(f"failures x{self.failure_factor:g}")
        if self.divergence_excess:
            parts.append(f"divergence +{self.divergence_excess * 100:g} pts")
        return ", ".join(parts) or "A/A"


AA = Effects()
EFFECTS: dict[str, Effects] = {
    "ttft": Effects(ttft_factor=1.12),
    "crash": Effects(crash_factor=3.0),
    "divergence": Effects(divergence_excess=0.05),
}
"""The real effects the proof asks for: TTFT p95 12 % slower, crashes 3x, divergence +5 pts."""
AT_THRESHOLD: dict[str, Effects] = {
    "errors@1.5": Effects(failure_factor=1.5),
    "crash@2": Effects(crash_factor=2.0),
}
"""Effects exactly on the default policy's thresholds (errors.rate_ratio <= 1.5, crash
rate_ratio <= 2): a PASS there is a false GO, which each criterion's ``false_go`` bounds."""


@dataclass(frozen=True)
class MonthShape:
    """How a month is generated (see the module docstring for what each field assumes)."""

    clustered: bool = False
    days: int = 30
    # latency
    pairs_per_hour: int = 417
    ttft_median_s: float = 0.25
    load_sd: float = 0.25
    request_sd: float = 0.45
    own_sd: float = 0.15
    engine_hour_sd: float = 0.06
    engine_day_sd: float = 0.04
    # failed exchanges
    exchanges_per_day: int = 24_000
    error_share: float = 0.002
    bursts_per_day: tuple[float, float] = (0.05, 0.2)
    burst_failures: float = 20.0
    # crashes
    crashes_per_day: float = 0.75
    loop_restarts: tuple[float, float] = (4.0, 9.0)
    # divergence
    divergence_pairs_per_day: int = 300
    divergence_max_pairs: int = 6000
    noise_floor: float = 0.03
    divergence_day_sd: float = 0.3
    floor_gap: tuple[float, float] = (0.0, 0.015)
    effects: Effects = field(default=AA)

    @property
    def kind(self) -> str:
        return "clustered" if self.clustered else "independent"

    def with_effects(self, effects: Effects) -> MonthShape:
        return replace(self, effects=effects)


@dataclass(frozen=True)
class Month:
    """One generated month, per day (index 0 = day 1) and role."""

    shape: MonthShape
    log_ttft: dict[str, np.ndarray]
    """Per role, ``(hours, pairs_per_hour)`` log TTFT (seconds) of the pairs the review's
    sample keeps each hour, in its random order."""
    sent: dict[str, np.ndarray]
    failed: dict[str, np.ndarray]
    crashes: dict[str, np.ndarray]
    episodes: dict[str, np.ndarray]
    """Crash episodes per day and role, as the review counts them (restarts within 30 minutes
    of the previous one's end are one episode: a crash loop is one event)."""
    divergence_pairs: dict[str, np.ndarray]
    """``candidate`` and ``replay``: pairs the divergence analysis reads each day."""
    diverged: dict[str, np.ndarray]

    def cumulative(self, name: str, role: str, day: int) -> int:
        """Sum over the first ``day`` days of one daily series."""
        series: np.ndarray = getattr(self, name)[role]
        return int(series[:day].sum())

    def ttft_sample(self, day: int, pairs: int) -> tuple[np.ndarray, np.ndarray]:
        """The review's latency sample at a look on ``day``: the first ``pairs / hours`` of
        each hour's kept pairs (incumbent, candidate TTFT in seconds)."""
        hours = 24 * day
        take = max(1, min(self.shape.pairs_per_hour, math.ceil(pairs / hours)))
        inc = np.exp(self.log_ttft["incumbent"][:hours, :take]).ravel()
        cand = np.exp(self.log_ttft["candidate"][:hours, :take]).ravel()
        return inc, cand


def _latency(shape: MonthShape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    hours, per = shape.days * 24, shape.pairs_per_hour
    h = np.arange(hours)
    phase = rng.uniform(0, 2 * math.pi)
    cycle = math.sqrt(2) * shape.load_sd * np.sin(2 * math.pi * h / 24 + phase)
    load = cycle + rng.normal(0, shape.load_sd / 3, hours)
    request = rng.normal(0, shape.request_sd, (hours, per))
    base = math.log(shape.ttft_median_s) + load[:, None] + request
    out = {}
    for role in ROLES:
        own = rng.normal(0, shape.own_sd, (hours, per))
        y = base + own
        if shape.clustered:
            y += rng.normal(0, shape.engine_hour_sd, hours)[:, None]
            y += np.repeat(rng.normal(0, shape.engine_day_sd, shape.days), 24)[:, None]
        if role == "candidate":
            y += math.log(shape.effects.ttft_factor)
        out[role] = y
    return out


def _failures(
    shape: MonthShape, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    sent = {r: np.full(shape.days, shape.exchanges_per_day, dtype=np.int64) for r in ROLES}
    failed = {}
    for role in ROLES:
        mean = shape.error_share * shape.exchanges_per_day
        if role == "candidate":
            mean *= shape.effects.failure_factor
        if shape.clustered:
            rate = rng.uniform(*shape.bursts_per_day)
            bursts = rng.poisson(rate, shape.days)
            in_bursts = np.array([rng.poisson(shape.burst_failures, b).sum() for b in bursts])
            base = max(0.0, mean - rate * shape.burst_failures)
            failed[role] = rng.poisson(base, shape.days) + in_bursts
        else:
            failed[role] = rng.poisson(mean, shape.days)
    return sent, failed


def _crashes(
    shape: MonthShape, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(restarts, episodes) per day and role."""
    restarts, episodes = {}, {}
    for role in ROLES:
        factor = shape.effects.crash_factor if role == "candidate" else 1.0
        if shape.clustered:
            # episodes at the same rate for identical engines; each engine-month's loops of
            # its own length (restarts per episode), the same mean
            mean_loop = sum(shape.loop_restarts) / 2
            loop = rng.uniform(*shape.loop_restarts)
            per_day = rng.poisson(factor * shape.crashes_per_day / (1 + mean_loop), shape.days)
            restarts[role] = np.array([(1 + rng.poisson(loop, e)).sum() for e in per_day])
            episodes[role] = per_day
        else:
            # isolated restarts, 0.75 a day: two within 30 minutes (one episode) are rare
            restarts[role] = rng.poisson(factor * shape.crashes_per_day, shape.days)
            episodes[role] = restarts[role]
    return restarts, episodes


def _divergence(
    shape: MonthShape, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    pairs, diverged = {}, {}
    gap = rng.uniform(*shape.floor_gap) if shape.clustered else 0.0
    for role, shift in (("candidate", shape.effects.divergence_excess), ("replay", -gap)):
        # A day's rate: the floor, shifted, with the day's variation on the logit scale.
        p = np.full(shape.days, shape.noise_floor + gap + shift)
        if shape.clustered:
            logit = np.log(p / (1 - p)) + rng.normal(0, shape.divergence_day_sd, shape.days)
            p = 1 / (1 + np.exp(-logit))
        # Each day keeps the most the analysis reads (300); a later look, whose per-day
        # sample shrinks to 6000 / d, thins it (:func:`divergence_counts`).
        n = np.full(shape.days, shape.divergence_pairs_per_day, dtype=np.int64)
        pairs[role] = n
        diverged[role] = rng.binomial(n, p)
    return pairs, diverged


def generate(shape: MonthShape, seed: int) -> Month:
    """One month drawn from ``shape`` with ``seed`` (same seed, same month)."""
    rng = np.random.default_rng(seed)
    log_ttft = _latency(shape, rng)
    sent, failed = _failures(shape, rng)
    crashes, episodes = _crashes(shape, rng)
    pairs, diverged = _divergence(shape, rng)
    return Month(shape, log_ttft, sent, failed, crashes, episodes, pairs, diverged)


def divergence_counts(
    month: Month, role: str, day: int, rng: np.random.Generator
) -> tuple[int, int]:
    """What the divergence analysis reads at a look on ``day`` for ``role``: (diverged, pairs),
    at most ``divergence_pairs_per_day`` a day and ``divergence_max_pairs`` in all, each day's
    sample a random subset of the day's pairs (hypergeometric thinning)."""
    shape = month.shape
    per_day = min(shape.divergence_pairs_per_day, shape.divergence_max_pairs // day)
    n = month.divergence_pairs[role][:day]
    k = month.diverged[role][:day]
    if per_day >= shape.divergence_pairs_per_day:
        return int(k.sum()), int(n.sum())
    kept = rng.hypergeometric(k, n - k, np.full(day, per_day))
    return int(kept.sum()), int(per_day * day)
