"""Incidents for the API: a thin adapter over :mod:`evaluator.incidents_query`, the module
``shadow-ab incidents`` uses too, so both show the same incidents and the same figures.

The adapter only turns the evaluator's plain dicts into the API's response models; it computes
nothing itself.
"""

from __future__ import annotations

import importlib
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Engine

from api.models import Incident, IncidentComparison


def _query() -> Any:
    return importlib.import_module("evaluator.incidents_query")


def list_incidents(
    engine: Engine,
    deployment: str,
    *,
    engine_role: str | None,
    kind: str | None,
    since: datetime | None,
    until: datetime | None,
) -> list[Incident]:
    rows = _query().query_incidents(
        engine, deployment, engine_role=engine_role, kind=kind, since=since, until=until
    )
    return [Incident.model_validate(_incident_fields(row, deployment)) for row in rows]


def _incident_fields(row: dict[str, Any], deployment: str) -> dict[str, Any]:
    fields = dict(row)
    fields.setdefault("deployment", deployment)
    fields.setdefault("role", None)
    fields.setdefault("detected_at", None)
    return fields


def compare(
    engine: Engine,
    deployment: str,
    *,
    by: Literal["day", "week"],
    kind: str | None,
    since: datetime | None,
    until: datetime | None,
) -> IncidentComparison:
    result = _query().compare_incidents(
        engine, deployment, by=by, kind=kind, since=since, until=until
    )
    return IncidentComparison.model_validate(
        {"deployment": deployment, "by": by, "kind": kind, "since": since, "until": until} | result
    )
