"""Writing findings to the ``incidents`` table: :func:`store_incidents`, idempotent.

A finding that overlaps a stored incident of the same deployment, engine and kind updates that
row (so re-running detection over another window, or after more data arrived, never
duplicates an incident). Store failures surface as :class:`storage.errors.StorageError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.dialects import postgresql, sqlite

from evaluator.incidents.model import Finding, unix_s
from storage.errors import translate
from storage.models import DEPLOYMENTS, INCIDENTS


def _overlaps(a0: float, a1: float | None, b0: float, b1: float | None, slack: float) -> bool:
    a_end = math.inf if a1 is None else a1
    b_end = math.inf if b1 is None else b1
    return a0 <= b_end + slack and b0 <= a_end + slack


def _last_seen(row: Mapping[str, Any]) -> float:
    """Where a stored incident still open (no end) was last seen going on: a later incident
    of the same kind must not be merged into it just because it never closed."""
    ev = row.get("evidence") or {}
    seen = [unix_s(row["started_at"])]
    for key in ("last_window_end", "still_down_at"):
        if ev.get(key):
            seen.append(unix_s(datetime.fromisoformat(ev[key])))
    return max(seen)


def store_incidents(engine: Engine, deployment: str, findings: Sequence[Finding]) -> int:
    """Write ``findings`` to ``incidents``; return how many rows are new.

    Idempotent: a finding with the same (engine, kind, started_at) as a stored incident, or
    overlapping one in time, updates that row (start widened to the earlier, end to the later,
    evidence replaced) instead of adding one. The role is kept in ``evidence.role``."""
    if not findings:
        return 0
    inc = INCIDENTS.c
    new = 0
    with translate(), engine.begin() as conn:
        ins = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
        conn.execute(ins(DEPLOYMENTS).on_conflict_do_nothing(), [{"name": deployment}])
        engines = sorted({f.engine for f in findings})
        stored = [
            dict(r._mapping)
            for r in conn.execute(
                select(
                    inc.id, inc.engine, inc.kind, inc.started_at, inc.ended_at, inc.evidence
                ).where(inc.deployment == deployment, inc.engine.in_(engines))
            )
        ]
        for f in sorted(findings, key=lambda f: (f.started_at, f.engine, f.kind)):
            f0, f1 = unix_s(f.started_at), (unix_s(f.ended_at) if f.ended_at else None)
            match = None
            for row in stored:
                if row["engine"] != f.engine or row["kind"] != f.kind:
                    continue
                r0 = unix_s(row["started_at"])
                r1 = unix_s(row["ended_at"]) if row["ended_at"] else _last_seen(row)
                if r0 == f0 or _overlaps(f0, f1, r0, r1, 0.0):
                    match = row
                    break
            evidence = {**f.evidence, "role": f.role}
            if match is None:
                result = conn.execute(
                    INCIDENTS.insert().values(
                        deployment=deployment,
                        engine=f.engine,
                        kind=f.kind,
                        started_at=f.started_at,
                        ended_at=f.ended_at,
                        evidence=evidence,
                    )
                )
                new += 1
                stored.append(
                    {
                        "id": (result.inserted_primary_key or [None])[0],
                        "engine": f.engine,
                        "kind": f.kind,
                        "started_at": f.started_at,
                        "ended_at": f.ended_at,
                        "evidence": evidence,
                    }
                )
                continue
            start = min(match["started_at"], f.started_at)
            ends = [match["ended_at"], f.ended_at]
            end = None if f.ended_at is None else max(e for e in ends if e is not None)
            conn.execute(
                INCIDENTS.update()
                .where(inc.id == match["id"])
                .values(started_at=start, ended_at=end, evidence=evidence, detected_at=func.now())
            )
            match.update(started_at=start, ended_at=end, evidence=evidence)
    return new
