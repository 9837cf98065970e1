"""Upgrades: each engine's incidents before and after each of its version changes.

:func:`upgrade_table` is pure. Per ``version_change`` incident (role, from, to, when), the time
of that role is cut at its version changes into version spans; the spans just before and just
after the change are compared: per incident kind other than the version change itself, the
episodes (:func:`evaluator.incidents.analysis.episodes`) and observed days in each, their rates
per day, and the exact conditional comparison of the after-rate to the before-rate at the
section's ``level`` (all kinds together: the seeds ask whether incidents follow upgrades). The
failures (per UTC day, whole days on each side of the change) are compared the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from evaluator.incidents.model import KINDS, Finding, Window, unix_s, utc_at, utc_window
from evaluator.rates import compare_poisson_rates, overlap_s

COMPARED = tuple(k for k in KINDS if k != "version_change")


def _spans(changes: Sequence[float], lo: float, hi: float) -> list[tuple[float, float]]:
    bounds = [lo, *[c for c in sorted(changes) if lo < c < hi], hi]
    return list(itertools.pairwise(bounds))


def upgrade_table(
    findings: Sequence[Finding],
    episodes: Sequence[Finding],
    exposure: Mapping[str, Sequence[tuple[float, float]]],
    window: Window,
    outcomes_by_day: Mapping[str, Mapping[int, tuple[int, int]]] | None = None,
    level: float = 0.95,
) -> list[dict[str, Any]]:
    """One row per version change in ``window`` (see the module docstring)."""
    lo_dt, hi_dt = utc_window(window)
    lo, hi = unix_s(lo_dt), unix_s(hi_dt)
    rows = []
    changes = sorted(
        (f for f in findings if f.kind == "version_change"), key=lambda f: f.started_at
    )
    for f in changes:
        role = f.role
        at = unix_s(f.end_or_start)
        cuts = [unix_s(c.end_or_start) for c in changes if c.role == role]
        spans = _spans(cuts, lo, hi)
        before = next((s for s in spans if s[1] == at), None)
        after = next((s for s in spans if s[0] == at), None)
        if before is None or after is None:
            continue
        sides: dict[str, dict[str, Any]] = {}
        for name, (a, b) in (("before", before), ("after", after)):
            days = overlap_s(exposure.get(role, ()), a, b) / 86400.0
            counts = {
                k: sum(
                    1
                    for e in episodes
                    if e.role == role and e.kind == k and a <= unix_s(e.started_at) < b
                )
                for k in COMPARED
            }
            sides[name] = {
                "from": utc_at(a).isoformat(),
                "to": utc_at(b).isoformat(),
                "observed_days": days,
                "episodes": counts,
                "rate_per_day": sum(counts.values()) / days if days > 0 else None,
            }
        x_a, t_a = sum(sides["after"]["episodes"].values()), sides["after"]["observed_days"]
        x_b, t_b = sum(sides["before"]["episodes"].values()), sides["before"]["observed_days"]
        comparison = (
            compare_poisson_rates(x_a, t_a, x_b, t_b, level).to_dict()
            if t_a > 0 and t_b > 0
            else None
        )
        failures = None
        per_day = (outcomes_by_day or {}).get(role) or {}
        if per_day:
            day_at = at / 86400.0
            pre = [
                v for d, v in per_day.items() if d + 1 <= day_at and d * 86400 >= before[0] - 86400
            ]
            post = [v for d, v in per_day.items() if d >= day_at and d * 86400 < after[1]]
            sent_b, fail_b = sum(s for s, _ in pre), sum(x for _, x in pre)
            sent_a, fail_a = sum(s for s, _ in post), sum(x for _, x in post)
            failures = {
                "before": {"sent": sent_b, "failed": fail_b},
                "after": {"sent": sent_a, "failed": fail_a},
                "comparison": compare_poisson_rates(
                    fail_a, float(sent_a), fail_b, float(sent_b), level
                ).to_dict()
                if sent_a > 0 and sent_b > 0
                else None,
            }
        rows.append(
            {
                "role": role,
                "engine": f.engine,
                "at": f.end_or_start.isoformat(),
                "from_version": f.evidence.get("from_version"),
                "to_version": f.evidence.get("to_version"),
                "restart": bool(f.evidence.get("restart")),
                "before": sides["before"],
                "after": sides["after"],
                "incidents_after_vs_before": comparison,
                "failures": failures,
            }
        )
    return rows
