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

from evaluator.exchange_rollups import in_ranges, split_window
from evaluator.results import Window
from evaluator.rollups import LOAD_EDGES, bucket_labels
from storage.models import EXCHANGE_COUNTS, EXCHANGE_PARITY, EXCHANGES, client_traffic


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
    """The parity table of ``deployment`` over ``window`` (see the module docstring): the
    closed, rolled-up hours from the exchange rollups, the rest from the raw rows."""
    x, p, c = EXCHANGES.c, EXCHANGE_PARITY.c, EXCHANGE_COUNTS.c
    sums: dict[int, list[float]] = {}
    counts: dict[str, int] = {}
    guards: dict[str, int] = {}

    def add(into: dict[Any, Any], key: Any, n: Any) -> None:
        into[key] = into.get(key, 0) + int(n or 0)

    with engine.connect() as conn:
        runs, raw = split_window(conn, deployment, (window[0], window[1]))
        if raw:
            in_raw = (
                x.deployment == deployment,
                in_ranges(x.sent_at, raw),
                client_traffic(),
            )
            bucket = _bucket(x.inflight_incumbent)
            by_bucket = (
                select(
                    bucket,
                    func.count(),
                    func.sum(x.inflight_incumbent),
                    func.sum(x.inflight_candidate),
                )
                .where(
                    *in_raw,
                    x.role == "candidate",
                    x.inflight_incumbent.is_not(None),
                    x.inflight_candidate.is_not(None),
                )
                .group_by(bucket)
            )
            for b, n, a, cd in conn.execute(by_bucket):
                acc = sums.setdefault(int(b), [0, 0.0, 0.0])
                acc[0] += int(n)
                acc[1] += float(a or 0)
                acc[2] += float(cd or 0)
            for r, n in conn.execute(select(x.role, func.count()).where(*in_raw).group_by(x.role)):
                add(counts, str(r), n)
            state = x.guard["state"].as_string()
            guard = (
                select(state, func.count()).where(*in_raw, x.role == "candidate").group_by(state)
            )
            for st, n in conn.execute(guard):
                add(guards, str(st) if st is not None else "none", n)
        if runs:
            in_runs = (p.deployment == deployment, in_ranges(p.hour, runs))
            rolled = (
                select(p.kind, p.key, func.sum(p.n), func.sum(p.sum_incumbent))
                .add_columns(func.sum(p.sum_candidate))
                .where(*in_runs)
                .group_by(p.kind, p.key)
            )
            for kind, key, n, a, cd in conn.execute(rolled):
                if kind == "guard":
                    add(guards, key, n)
                    continue
                acc = sums.setdefault(int(key), [0, 0.0, 0.0])
                acc[0] += int(n)
                acc[1] += float(a or 0)
                acc[2] += float(cd or 0)
            by_role = (
                select(c.role, func.sum(c.n))
                .where(c.deployment == deployment, in_ranges(c.minute, runs))
                .group_by(c.role)
            )
            for r, n in conn.execute(by_role):
                add(counts, str(r), n)
    labels = bucket_labels(LOAD_EDGES)
    rows = [(b, n, a / n, cd / n) for b, (n, a, cd) in sorted(sums.items()) if n]
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
