"""Incidents for the API: a thin adapter over :mod:`evaluator.incidents.query`, the module
``shadow-ab incidents`` uses too, so both show the same incidents and the same figures.

The adapter computes nothing: it turns the evaluator's plain dicts into the response models
(infinite floats, which JSON cannot carry, become null) and its errors into the API's.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Engine

from api.errors import BadParameter, NotFound
from api.models import Incident, IncidentComparison
from evaluator.errors import BadQuery, EvaluatorError, UnknownDeployment
from evaluator.incidents import query as q

MAX_BUCKETS = 1000
"""Most day or week buckets one comparison answers with (about 2.7 years by day, 19 by week);
a wider window is a 422 saying so."""


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (nested in dicts and lists) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _translate(exc: EvaluatorError) -> Exception:
    if isinstance(exc, UnknownDeployment):
        return NotFound(str(exc))
    if isinstance(exc, BadQuery):
        return BadParameter(str(exc))
    return exc


def list_incidents(
    engine: Engine,
    deployment: str,
    *,
    engine_role: str | None,
    kind: str | None,
    since: datetime | None,
    until: datetime | None,
) -> list[Incident]:
    try:
        rows = q.query_incidents(
            engine, deployment, engine_role=engine_role, kind=kind, since=since, until=until
        )
    except EvaluatorError as exc:
        raise _translate(exc) from exc
    return [Incident.model_validate(finite(row)) for row in rows]


def compare(
    engine: Engine,
    deployment: str,
    *,
    by: Literal["day", "week"],
    kind: str | None,
    since: datetime | None,
    until: datetime | None,
) -> IncidentComparison:
    try:
        result = q.compare_incidents(
            engine,
            deployment,
            by=by,
            kind=kind,
            since=since,
            until=until,
            max_buckets=MAX_BUCKETS,
        )
    except EvaluatorError as exc:
        raise _translate(exc) from exc
    return IncidentComparison.model_validate(finite(result))
