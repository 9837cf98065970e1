"""``/v1/deployments``: the shadow experiments the store knows."""

from __future__ import annotations

from fastapi import APIRouter

from api import queries
from api.auth import Reader
from api.deps import Conn, DeploymentName, deployment_row
from api.models import Deployment, DeploymentList, DeploymentSummary, ReportSummary
from api.queries import AnyRow
from storage.models import INCIDENTS, REPORTS

router = APIRouter(tags=["deployments"])


def summary(row: AnyRow) -> DeploymentSummary:
    return DeploymentSummary.model_validate(row._mapping, from_attributes=False)


@router.get("/deployments", response_model=DeploymentList, summary="List deployments")
def list_deployments(_who: Reader, conn: Conn) -> DeploymentList:
    return DeploymentList(items=[summary(r) for r in queries.deployments(conn)])


@router.get("/deployments/{name}", response_model=Deployment, summary="One deployment")
def get_deployment(name: DeploymentName, _who: Reader, conn: Conn) -> Deployment:
    row = deployment_row(conn, name)
    latest = queries.report_summaries(conn, name, limit=1)
    return Deployment.model_validate(
        {
            **row._mapping,
            "reports": queries.count_of(conn, REPORTS, name),
            "incidents": queries.count_of(conn, INCIDENTS, name),
            "latest_report": ReportSummary.model_validate(latest[0]._mapping) if latest else None,
        }
    )
