"""What a count criterion can detect with the data it has, said in its verdict's reason.

A rate ratio (``errors.rate_ratio``, ``incidents.<kind>.rate_ratio``) rests on few events: a
month of crash-loop episodes at 0.1 a day is ~3 on the incumbent's side, and no test can tell
a candidate crashing 3x as often from the threshold of 2 with that. An INCONCLUSIVE, or a GO,
on such data says nothing about a ratio the data could not have seen, and the reason should
say so. :func:`power_note` gives, per count criterion (op ``<=``, key ending ``.rate_ratio``):

- the **detectable ratio**: the smallest true ratio that the criterion would FAIL (NO-GO) at
  the plan's last look with probability :data:`POWER` (90 %), if events keep coming at the pace
  seen so far. From the measurement's own interval (exact, with the overdispersion factor the
  analysis applied and Student's t on its degrees of freedom): its standard error on the log
  scale, ``log(high / low) / (2 z(level))``, shrunk to the horizon as
  ``sqrt(days / horizon_days)`` (information grows with days of events), and
  ``threshold * exp((z_final + z_power) * se)``, ``z_final`` being the last
  look's boundary. Past the horizon, the data as it is at the last look's boundary;
- **underpowered** when that ratio is above :data:`UNDERPOWERED` times the threshold (the
  criterion cannot see a candidate that much worse), with the events it would take:
  :func:`events_needed`, the incumbent's events by the horizon for a candidate at that ratio
  to FAIL with 90 % probability (Poisson events; clustered ones need more, by their
  overdispersion factor).

What it assumes: the log ratio is about normal (a Wald approximation of the exact interval:
rough below ~10 events a side, and then on the optimistic side, so "underpowered" is if
anything said too rarely); the pace of events stays the same to the horizon. It changes no
outcome: a note on the reason only. Pure, no I/O.
"""

from __future__ import annotations

import math

from scipy import stats

from evaluator.policy import Criterion
from evaluator.results import Measurement
from evaluator.sequential import Look, boundaries, z_of

POWER = 0.90
"""The probability of a NO-GO the detectable ratio is stated at."""
UNDERPOWERED = 1.5
"""A criterion that cannot detect a ratio this many times its threshold is underpowered."""
SUFFIX = ".rate_ratio"


def applies(c: Criterion) -> bool:
    """Whether ``c`` is a count criterion whose power is stated (a rate ratio, op ``<=``)."""
    return c.op == "<=" and c.key.endswith(SUFFIX) and c.threshold > 0


def final_z(look: Look) -> float:
    """The boundary (standard errors) of the plan's last look."""
    return boundaries(look.alpha, look.looks, look.spending)[-1]


def log_se(m: Measurement | None) -> float | None:
    """The standard error of ``log(ratio)`` the measurement's interval implies; None when the
    interval does not bound the ratio on both sides (no events on a side)."""
    if m is None or m.interval is None or m.value is None:
        return None
    low, high, level = m.interval.low, m.interval.high, m.interval.level
    if not (0 < low <= high < math.inf) or not 0 < level < 1:
        return None
    return (math.log(high) - math.log(low)) / (2.0 * z_of(level))


def detectable_ratio(
    m: Measurement | None, threshold: float, look: Look, power: float = POWER
) -> float | None:
    """The smallest true ratio FAILed at the last look with probability ``power`` at the pace
    of events so far (see the module docstring); None when the interval bounds nothing yet."""
    se = log_se(m)
    if se is None or look.days <= 0:
        return None
    if look.days < look.horizon_days:
        se *= math.sqrt(look.days / look.horizon_days)
    return threshold * math.exp((final_z(look) + float(stats.norm.ppf(power))) * se)


def events_needed(
    threshold: float, look: Look, factor: float = UNDERPOWERED, power: float = POWER
) -> float:
    """Incumbent events by the horizon for a candidate at ``factor * threshold`` times the
    incumbent's rate to be FAILed at the last look with probability ``power`` (Poisson counts:
    ``se^2 = 1 / x + 1 / (ratio x)``)."""
    ratio = factor * threshold
    k = (final_z(look) + float(stats.norm.ppf(power))) / math.log(factor)
    return (1.0 + 1.0 / ratio) * k * k


def power_note(c: Criterion, m: Measurement | None, look: Look | None) -> tuple[float | None, str]:
    """(detectable ratio or None, the sentence for the reason; empty when ``c`` is not a count
    criterion or there is no look)."""
    if look is None or not applies(c):
        return None, ""
    worse = UNDERPOWERED * c.threshold
    need = events_needed(c.threshold, look)
    needs = (
        f"telling {worse:.3g} from {c.threshold:g} with {POWER * 100:.0f} % probability takes about"
        f" {need:.0f} incumbent events by the horizon (more when they come in bursts)"
    )
    r = detectable_ratio(m, c.threshold, look)
    if r is None:
        return None, f"power: too few events to bound the ratio on both sides yet; {needs}"
    when = (
        f"by the horizon's look (day {look.horizon_days:g}), at the pace of events so far,"
        if look.days < look.horizon_days
        else "at the last look's boundary, with the data so far,"
    )
    text = f"power: {when} it would NO-GO a true ratio of {r:.3g} or more with {POWER * 100:.0f} %"
    text += " probability"
    if r > worse:
        text += f": underpowered, {needs}"
    return r, text
