"""The sequential decision: which confidence level each look at a review must use so that
looking every day for a month does not inflate the verdict's error rates. Pure, no I/O.

A reviewer looks at a deployment's review any day of a planned horizon (``horizon_days``,
30 by default: one planned look a day). Each look judges every criterion of the policy on an
interval; a criterion FAILs at a look when its interval lies wholly beyond its threshold.
Without a correction every look is a new chance of a false FAIL, and every criterion another
one: 30 daily looks at 11 criteria (the default policy then; 16 now) at 95 % each made most
identical-engine months a NO-GO.

**Family-wise budget** (Bonferroni over criteria). The policy's ``false_nogo`` (0.05) is the
chance, at most, that a review of two identical engines is NO-GO at some look of the plan.
It is split equally across the policy's K criteria: each criterion may falsely FAIL at some
look with probability ``alpha = false_nogo / K`` (one-sided: a FAIL is the interval beyond
the threshold on the bad side). The chance that any criterion falsely FAILs is then at most the
sum, ``false_nogo``, whatever the dependence between criteria (the criteria of one review are
positively dependent -- p95 and spread of one metric, TTFT and E2E -- so the real rate is
lower). This is the rule Spotify states for guardrail metrics: each guardrail's test is a veto,
so their false-veto rates add up and each gets a share of the budget (Schultzberg, Kjellin and
Rydberg 2021, "Risk-aware product decisions in A/B tests with multiple metrics").

**Alpha spending over the looks** (Lan and DeMets 1983). Each criterion's ``alpha`` is spent
over the planned looks by a spending function of the information fraction
``t = days / horizon_days`` (days of data stand in for information: it grows with traffic):

- ``obrien-fleming`` (default): ``alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t))``, almost
  nothing early (a day-1 NO-GO needs overwhelming evidence; day-1 effects of the hour or the
  weekday cannot carry it), close to the unadjusted level at the horizon;
- ``pocock``: ``alpha(t) = alpha ln(1 + (e - 1) t)``, about equal boundaries at every look.

The boundary ``c_j`` of look ``j`` (in standard errors) is found by the recursive numerical
integration of Armitage, McPherson and Rowe (1969) so that, for a statistic that is a normal
estimate of cumulative data (independent increments: ``corr(Z_i, Z_j) = sqrt(t_i / t_j)``),
the chance of crossing first at look ``j`` is ``alpha(t_j) - alpha(t_{j-1})``; the crossing
chance over the whole plan is then ``alpha``. A criterion's interval at look ``j`` is asked
for at the two-sided level ``2 Phi(c_j) - 1``: its one side beyond the threshold is the boundary
crossed. These are Jennison and Turnbull's repeated confidence intervals: they cover the truth
at every planned look at once, so the same intervals decide GO (wholly on the good side) with
the same error bound on the other side.

**Any interval method fits**: an analysis is asked for an interval at a level, nothing more
(exact binomial, Wilson, bootstrap, a cluster bootstrap). What the bound assumes:

- the interval has its stated coverage at its level (a percentile bootstrap of B resamples
  cannot reach levels beyond about ``1 - 2 / (B + 1)``: at early looks it returns its widest
  resamples, an interval narrower than asked for);
- successive looks' statistics are about as correlated as cumulative normal estimates are. A
  statistic whose information stops growing (a sample capped at a fixed size, drawn afresh at
  each look) is less correlated across looks, and the real error rate is then somewhat above
  the plan's (the Bonferroni split over looks would be the bound that needs nothing: the
  boundaries are tighter than that by design);
- one look a day: looks are counted by whole days of data, rounded down (so a look on day
  2.5 uses day 2's boundary, and any number of looks within one day share one boundary: they
  see almost the same data, a small excess not covered by the bound);
- looks are counted from the deployment's start (its stored ``started_at``, or its first
  mirrored pair), not from a review window's own first day: a review asked for a later
  window (``--from``) is the same look of the same plan, not look 1 of a new one
  (:func:`evaluator.review.build_review`);
- after the horizon the plan is spent: such a look spends no further alpha
  (:attr:`Look.spends` is 0), its boundary stays the horizon's, and the verdict says in its
  reason that it is past the horizon and outside the plan's error bounds.

What it does not do: correct an interval that is too narrow for its data (clustered requests,
overdispersed counts); that is each analysis' own interval's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from scipy import optimize, stats

Spending = Literal["obrien-fleming", "pocock"]
SPENDINGS: tuple[str, ...] = ("obrien-fleming", "pocock")

MAX_Z = 6.0
"""Boundaries are capped at 6 standard errors (a two-sided level of 1 - 2e-9): beyond that,
intervals of any method lose their meaning, and no real effect needs more."""


def spent(t: float, alpha: float, spending: str) -> float:
    """Alpha spent by information fraction ``t`` (0..1) under ``spending``."""
    t = min(max(t, 0.0), 1.0)
    if t <= 0.0:
        return 0.0
    if spending == "obrien-fleming":
        z = float(stats.norm.isf(alpha / 2.0))
        return float(2.0 * stats.norm.sf(z / math.sqrt(t)))
    if spending == "pocock":
        return alpha * math.log1p((math.e - 1.0) * t)
    raise ValueError(f"spending must be one of {', '.join(SPENDINGS)}, got {spending!r}")


@lru_cache(maxsize=64)
def boundaries(alpha: float, looks: int, spending: str) -> tuple[float, ...]:
    """One-sided boundaries ``c_1..c_looks`` (standard errors) for equally spaced looks.

    Armitage-McPherson-Rowe recursion on the canonical process ``S(t) ~ N(0, t)`` with
    independent increments; ``g`` is the sub-density of ``S`` at the last look over the paths
    that crossed no boundary yet, on a grid of step ``h``."""
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    if looks < 1:
        raise ValueError(f"looks must be >= 1, got {looks}")
    dt = 1.0 / looks
    sd = math.sqrt(dt)
    h = sd / 12.0
    out: list[float] = []
    grid: np.ndarray | None = None
    g: np.ndarray | None = None
    before = 0.0
    for j in range(1, looks + 1):
        t = j * dt
        target = spent(t, alpha, spending) - before
        before += target

        def crossing(b: float, g: np.ndarray | None = g, grid: np.ndarray | None = grid) -> float:
            if g is None or grid is None:
                return float(stats.norm.sf(b / sd))
            return float(np.sum(g * stats.norm.sf((b - grid) / sd)) * h)

        cap = MAX_Z * math.sqrt(t)
        if target <= crossing(cap):
            b = cap
        else:
            b = float(optimize.brentq(lambda x, a=target: crossing(x) - a, -cap, cap, xtol=1e-10))
        out.append(b / math.sqrt(t))
        # The sub-density at look j over the continuation region (-8 sqrt(t), b).
        new_grid = np.arange(-8.0 * math.sqrt(t), b, h)
        if g is None or grid is None:
            new_g = stats.norm.pdf(new_grid / sd) / sd
        else:
            kernel = stats.norm.pdf((new_grid[:, None] - grid[None, :]) / sd) / sd
            new_g = kernel @ g * h
        grid, g = new_grid, new_g
    return tuple(out)


def level_of(z: float) -> float:
    """The two-sided level whose interval's one side lies ``z`` standard errors out."""
    return float(1.0 - 2.0 * stats.norm.sf(z))


def z_of(level: float) -> float:
    """The standard errors out to one side of a two-sided ``level`` interval."""
    return float(stats.norm.isf((1.0 - level) / 2.0))


@dataclass(frozen=True)
class Look:
    """One look at a review within its plan: the level every criterion's interval must have."""

    days: float
    """Days of the plan at this look: from the deployment's start to the window's last pair
    (:func:`evaluator.review.plan_days`; a window's own ``data.days`` where no start is
    known)."""
    look: int
    """The planned look it counts as: whole days, rounded down, between 1 and ``looks``."""
    looks: int
    """Planned looks: one a day over the horizon."""
    horizon_days: float
    spending: str
    false_nogo: float
    """The family-wise chance of a false NO-GO the plan keeps to."""
    criteria: int
    alpha: float
    """Each criterion's share of ``false_nogo`` (one-sided, over the whole plan)."""
    spent: float
    """Of ``alpha``, how much the plan has spent up to and including this look."""
    z: float
    """The boundary at this look, in standard errors."""
    level: float
    """The two-sided level of every criterion's interval at this look."""
    false_go: float | None = None
    """Each criterion's chance, at most, of a PASS at some look of the plan when the truth sits
    on its threshold (one-sided, not split over criteria: see :func:`look_at`); None: PASS
    at the same level as FAIL."""
    pass_z: float | None = None
    """The PASS boundary at this look, in standard errors (``z`` when ``false_go`` is None)."""
    pass_level: float | None = None
    """The two-sided level whose interval must lie wholly on the good side for a PASS."""

    @property
    def final(self) -> bool:
        """At or past the last planned look."""
        return self.look >= self.looks

    @property
    def past_horizon(self) -> bool:
        """More than an hour of data past the planned horizon: the plan is spent."""
        return self.days > self.horizon_days + 1.0 / 24.0

    @property
    def spends(self) -> float:
        """Of ``alpha``, what this look adds to what the plan's earlier looks spent: the
        increment of its planned look, 0 past the horizon (the plan spent it all at the
        horizon's look, and a later look spends nothing more)."""
        if self.past_horizon:
            return 0.0
        return self.spent - spent((self.look - 1) / self.looks, self.alpha, self.spending)

    def horizon_text(self) -> str:
        """The plain-words note of a look past the horizon ("" within the plan)."""
        if not self.past_horizon:
            return ""
        return (
            f"past the planned horizon: {self.days:.3g} days into the deployment, after the"
            f" plan's {self.horizon_days:g} days; the plan's alpha is spent and this look spends"
            f" none more: it is judged at the horizon's boundary ({self.z:.2f} standard errors,"
            f" {level_text(self.level)}), and its error rates are not covered by the plan"
        )

    def text(self) -> str:
        where = (
            "past the planned horizon (not covered by the plan)"
            if self.past_horizon
            else f"look {self.look} of {self.looks}"
        )
        return (
            f"{where}: {self.days:.3g} days into the plan; intervals at {level_text(self.level)}"
            f" ({self.z:.2f} standard errors: {self.spending} spending of"
            f" {self.false_nogo:g} / {self.criteria} criteria, {_pct_share(self.spent)} of"
            f" {_pct_share(self.alpha)} spent)"
            + (
                ""
                if self.pass_level is None or self.pass_level >= self.level
                else f"; PASS at {level_text(self.pass_level)} ({self.pass_z:.2f} standard"
                f" errors: {self.false_go:g} per criterion)"
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "days": self.days,
            "look": self.look,
            "looks": self.looks,
            "horizon_days": self.horizon_days,
            "spending": self.spending,
            "false_nogo": self.false_nogo,
            "criteria": self.criteria,
            "alpha": self.alpha,
            "spent": self.spent,
            "z": self.z,
            "level": self.level,
            "false_go": self.false_go,
            "pass_z": self.pass_z,
            "pass_level": self.pass_level,
            "final": self.final,
            "past_horizon": self.past_horizon,
            "spends": self.spends,
            "text": self.text(),
        }


def level_text(level: float) -> str:
    """A level for people: 95 %, 99.38 %, or 1 - 2.0e-09 when very close to 1."""
    miss = 1.0 - level
    if miss >= 1e-4:
        return f"{level * 100:.4g} %"
    return f"1 - {miss:.1e}"


def _pct_share(x: float) -> str:
    return f"{x * 100:.3g} %"


def planned_looks(horizon_days: float) -> int:
    """One planned look a day over the horizon (at least one)."""
    return max(1, math.ceil(horizon_days - 1e-9))


def look_at(
    days: float,
    *,
    horizon_days: float,
    false_nogo: float,
    criteria: int,
    spending: str = "obrien-fleming",
    false_go: float | None = None,
) -> Look:
    """The look a review with ``days`` of data is, and the level its intervals must have.

    With ``false_go`` the PASS side has boundaries of its own: ``false_go`` (one-sided, per
    criterion, not divided among the criteria) spent over the looks as ``false_nogo``'s share
    is. A false GO needs the criterion the candidate is really worse on to PASS (every other
    one passing does not make it happen), so its chance is at most that one criterion's
    ``false_go``, however many criteria the policy has; a false NO-GO can come from any
    criterion, so that side is split. The PASS boundary is never further out than the FAIL one."""
    looks = planned_looks(horizon_days)
    alpha = false_nogo / max(1, criteria)
    index = min(looks, max(1, math.floor(days * looks / horizon_days + 1e-9)))
    z = boundaries(alpha, looks, spending)[index - 1]
    pass_z = z if false_go is None else min(z, boundaries(false_go, looks, spending)[index - 1])
    return Look(
        days=float(days),
        look=index,
        looks=looks,
        horizon_days=float(horizon_days),
        spending=spending,
        false_nogo=float(false_nogo),
        criteria=max(1, criteria),
        alpha=alpha,
        spent=spent(index / looks, alpha, spending),
        z=z,
        level=level_of(z),
        false_go=false_go,
        pass_z=pass_z,
        pass_level=level_of(pass_z),
    )
