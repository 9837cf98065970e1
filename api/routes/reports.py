"""``/v1/deployments/{name}/reports``: the stored go/no-go reviews, as JSON or their HTML report.

Without the ``content`` scope, prompt and output fields of the body are null
(:func:`api.redact.redact`); the HTML page of a report whose body holds such text is then
refused (403), since a page cannot be redacted reliably.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import HTMLResponse, Response

from api import audit, queries
from api.auth import Principal, Reader
from api.deps import MAX_PAGE, Conn, DeploymentName, Format, deployment_row, wants_html
from api.errors import MissingScope, NotFound
from api.html import PAGE_HEADERS
from api.models import Report, ReportList, ReportSummary, problem_response
from api.queries import AnyRow
from api.redact import redact

router = APIRouter(tags=["reports"])

REPORT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"text/html": {"schema": {"type": "string"}}},
        "description": "the report as JSON, or its HTML page with `?format=html`",
    },
    403: problem_response("the HTML page needs the `content` scope"),
}

FormatQuery = Annotated[
    Format | None,
    Query(description="`json` (default) or `html`; without it the Accept header decides"),
]


@router.get(
    "/deployments/{name}/reports",
    response_model=ReportList,
    summary="A deployment's reports, newest first",
)
def list_reports(
    name: DeploymentName,
    _who: Reader,
    conn: Conn,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> ReportList:
    deployment_row(conn, name)
    rows = queries.report_summaries(conn, name, limit)
    return ReportList(
        deployment=name, items=[ReportSummary.model_validate(r._mapping) for r in rows]
    )


def _answer(
    row: AnyRow | None, what: str, name: str, who: Principal, html: bool, route: str
) -> Report | Response:
    if row is None:
        raise NotFound(f"deployment {name!r} has no report {what}")
    fields = dict(row._mapping)
    body, had_content = redact(fields.pop("body"))
    page = fields.pop("html")
    if had_content and who.sees_content:
        audit.content_read(who, route, name, report_id=row.id)
    if html:
        if page is None:
            raise NotFound(f"report {row.id} of {name!r} has no HTML page: ask for JSON")
        if had_content and not who.sees_content:
            raise MissingScope(
                f"report {row.id} shows prompts or outputs: its HTML page needs the 'content'"
                " scope (the JSON form is available, with those fields null)"
            )
        return HTMLResponse(page, headers=PAGE_HEADERS)
    shown = row.body if who.sees_content else body
    return Report.model_validate({**fields, "body": shown})


@router.get(
    "/deployments/{name}/reports/latest",
    response_model=Report,
    summary="The newest report",
    responses=REPORT_RESPONSES,
)
def latest_report(
    request: Request,
    name: DeploymentName,
    who: Reader,
    conn: Conn,
    format: FormatQuery = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Report | Response:
    deployment_row(conn, name)
    row = queries.report(conn, name, None)
    return _answer(row, "yet", name, who, wants_html(format, accept), request.url.path)


@router.get(
    "/deployments/{name}/reports/{report_id}",
    response_model=Report,
    summary="One report",
    responses=REPORT_RESPONSES,
)
def get_report(
    request: Request,
    name: DeploymentName,
    report_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
    who: Reader,
    conn: Conn,
    format: FormatQuery = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Report | Response:
    deployment_row(conn, name)
    row = queries.report(conn, name, report_id)
    return _answer(row, str(report_id), name, who, wants_html(format, accept), request.url.path)
