"""``/v1/deployments/{name}/incidents``: incidents with filters, and the day/week comparison.

Both answer with what :mod:`evaluator.incidents.query` computes (through
:mod:`api.incidents`), the same figures ``shadow-ab incidents`` prints.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from api import incidents
from api.auth import Reader
from api.deps import Conn, DeploymentName, Store, Time, check_window, deployment_row, utc_param
from api.models import IncidentComparison, IncidentList

router = APIRouter(tags=["incidents"])

Kind = Literal["crash", "version_change", "leak", "error_burst", "hang"]
EngineRole = Literal["incumbent", "candidate", "replay"]
KindQuery = Annotated[Kind | None, Query(description="only incidents of this kind")]
SinceQuery = Annotated[
    Time | None, Query(description="started at or after (ISO 8601; no zone = UTC)")
]
UntilQuery = Annotated[Time | None, Query(description="started before (ISO 8601)")]


@router.get(
    "/deployments/{name}/incidents",
    response_model=IncidentList,
    summary="Incidents, filtered",
)
def list_incidents(
    name: DeploymentName,
    _who: Reader,
    conn: Conn,
    engine: Store,
    engine_role: Annotated[EngineRole | None, Query(description="only this engine role")] = None,
    kind: KindQuery = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
) -> IncidentList:
    deployment_row(conn, name)
    since, until = utc_param(since, "since"), utc_param(until, "until")
    check_window(since, until)
    items = incidents.list_incidents(
        engine, name, engine_role=engine_role, kind=kind, since=since, until=until
    )
    return IncidentList(
        deployment=name, engine_role=engine_role, kind=kind, since=since, until=until, items=items
    )


@router.get(
    "/deployments/{name}/incidents/compare",
    response_model=IncidentComparison,
    summary="Incident counts per day or week, candidate against incumbent",
)
def compare_incidents(
    name: DeploymentName,
    _who: Reader,
    conn: Conn,
    engine: Store,
    by: Annotated[Literal["day", "week"], Query(description="bucket size")] = "day",
    kind: KindQuery = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
) -> IncidentComparison:
    deployment_row(conn, name)
    since, until = utc_param(since, "since"), utc_param(until, "until")
    check_window(since, until)
    return incidents.compare(engine, name, by=by, kind=kind, since=since, until=until)
