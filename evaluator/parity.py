"""Load parity: did the candidate run at the concurrency the incumbent ran at?

A candidate that gets a tenth of the traffic (sampling), or whose shadow requests the cap and
the interference guard thin out, runs at a lower concurrency than the incumbent and looks
faster for it. The seeds' first rule is to compare at the same concurrency, so the latency
section reports, from the candidate's records (each carries ``inflight_incumbent`` and
``inflight_candidate`` at dispatch, and the guard's state):

- per load bucket (``inflight_incumbent`` at dispatch, the by_load buckets): the mirrored pairs
  and both engines' mean in-flight counts;
- the shadow share (candidate / incumbent exchanges), the replay share (replay / candidate)
  and the guard's states;
- :func:`parity_reason`: why latency cannot be judged, when the candidate's mean in-flight count
  is outside ``[1 / (1 + tolerance), 1 + tolerance]`` times the incumbent's while the incumbent
  had at least ``min_inflight`` in flight. The tolerance is loose on purpose: at one arrival
  rate, a faster engine has fewer requests in flight (Little's law), a candidate a third faster
  half as many more.

Errors: SQLAlchemy's, as the store raises them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, case, func, select

from evaluator.results import Window
from evaluator.rollups import LOAD_EDGES, bucket_labels
from storage.models import EXCHANGES


@dataclass(frozen=True)
class ParityConfig:
    tolerance: float = 0.5
    """The candidate's mean in-flight count may be this much above the incumbent's, or below
    it by the same factor (1 / (1 + tolerance))."""
    min_inflight: float = 1.0
    """Below this mean incumbent in-flight count both engines are idle: nothing to compare."""


def _bucket(column: Any) -> Any:
    whens = [(column < e, i) for i, e in enumerate(LOAD_EDGES)]
    return case(*whens, else_=len(LOAD_EDGES))


def load_parity(engine: Engine, deployment: str, window: Window) -> dict[str, Any]:
    """The parity table of ``deployment`` over ``window`` (see the module docstring)."""
    x = EXCHANGES.c
    cond = (
        x.deployment == deployment,
        x.sent_at >= window[0],
        x.sent_at < window[1],
        x.synthetic.is_(None),  # the mirror's probes are not client traffic
    )
    bucket = _bucket(x.inflight_incumbent)
    by_bucket = (
        select(bucket, func.count(), func.avg(x.inflight_incumbent), func.avg(x.inflight_candidate))
        .where(
            *cond,
            x.role == "candidate",
            x.inflight_incumbent.is_not(None),
            x.inflight_candidate.is_not(None),
        )
        .group_by(bucket)
    )
    roles = select(x.role, func.count()).where(*cond).group_by(x.role)
    state = x.guard["state"].as_string()
    guard = select(state, func.count()).where(*cond, x.role == "candidate").group_by(state)
    labels = bucket_labels(LOAD_EDGES)
    with engine.connect() as conn:
        rows = sorted(conn.execute(by_bucket).all(), key=lambda r: int(r[0]))
        counts = {str(r): int(n) for r, n in conn.execute(roles)}
        guards = {str(s) if s is not None else "none": int(n) for s, n in conn.execute(guard)}
    parsed = [
        (labels[int(b)], int(n), None if a is None else float(a), None if c is None else float(c))
        for b, n, a, c in rows
    ]
    buckets = [
        {"bucket": label, "pairs": n, "inflight_incumbent": a, "inflight_candidate": c}
        for label, n, a, c in parsed
    ]
    both = [(n, a, c) for _, n, a, c in parsed if a is not None and c is not None]
    total = sum(n for n, _, _ in both)
    mean_inc = sum(n * a for n, a, _ in both) / total if total else None
    mean_cand = sum(n * c for n, _, c in both) / total if total else None
    inc, cand, replay = (counts.get(r, 0) for r in ("incumbent", "candidate", "replay"))
    return {
        "by_load": buckets,
        "mean_inflight": {"incumbent": mean_inc, "candidate": mean_cand},
        "inflight_ratio": mean_cand / mean_inc if mean_inc and mean_cand is not None else None,
        "exchanges": counts,
        "shadow_share": cand / inc if inc else None,
        "replay_share": replay / cand if cand else None,
        "guard_states": guards,
    }


def parity_reason(parity: dict[str, Any], config: ParityConfig = ParityConfig()) -> str:
    """Why latency cannot be judged at this load parity ("" when it can)."""
    mean = parity.get("mean_inflight") or {}
    inc, cand = mean.get("incumbent"), mean.get("candidate")
    if inc is None or cand is None or inc < config.min_inflight:
        return ""
    ratio = cand / inc
    if 1.0 / (1.0 + config.tolerance) <= ratio <= 1.0 + config.tolerance:
        return ""
    share = parity.get("shadow_share")
    share_text = "" if share is None else f", {share:.0%} of the incumbent's requests shadowed"
    return (
        f"the candidate ran at a different concurrency than the incumbent: {cand:.2g} requests"
        f" in flight on average at dispatch against {inc:.2g} ({ratio:.2f}x{share_text});"
        " latency compares only at the same concurrency: shadow every request (sampling rate 1,"
        " a cap above the incumbent's load) or read the latency-vs-concurrency curve"
    )
