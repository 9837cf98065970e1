"""``/v1/deployments/{name}/pairs``: divergent pairs, paged, and one pair side by side.

Paging is by keyset (:mod:`api.queries`): ``next_cursor`` encodes the last pair's
``(sent_at, pair_id)``. The side-by-side view is JSON (offsets of the first divergence in
``divergence.<role>.highlight``) or, with ``?format=html``, a page with the divergence marked;
the page shows outputs, so it needs the ``content`` scope.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import HTMLResponse, Response

from api import audit, queries
from api.auth import Principal, Reader
from api.deps import (
    MAX_PAGE,
    Conn,
    DeploymentName,
    Format,
    Time,
    check_window,
    deployment_row,
    utc_param,
    wants_html,
)
from api.divergence import compare, near_tie_nats_of
from api.errors import MissingScope, NotFound
from api.html import PAGE_HEADERS, pair_page
from api.models import DivergentPair, PairDetail, PairPage, Side, SideSummary, problem_response
from api.queries import AnyRow
from api.redact import redact_error, redact_parameters, split_request
from evaluator.compare import NEAR_TIE_NATS

router = APIRouter(tags=["pairs"])


def _side_summary(row: AnyRow, prefix: str, who: Principal) -> SideSummary:
    m = row._mapping
    return SideSummary(
        role=m[f"{prefix}role"],
        engine=m[f"{prefix}engine"],
        status=m[f"{prefix}status"],
        finish_reason=m[f"{prefix}finish_reason"],
        completion_tokens=m[f"{prefix}completion_tokens"],
        ttft_s=m[f"{prefix}ttft_s"],
        e2e_s=m[f"{prefix}e2e_s"],
        tpot_s=m[f"{prefix}tpot_s"],
        output_text=m[f"{prefix}output_text"] if who.sees_content else None,
    )


def _columns(row: AnyRow, prefix: str) -> dict[str, Any]:
    """One side's columns of a divergent-pairs row, without the prefix."""
    m = row._mapping
    return {c: m[f"{prefix}{c}"] for c in queries.SIDE_COLUMNS}


@router.get(
    "/deployments/{name}/pairs/divergent",
    response_model=PairPage,
    summary="Pairs whose outputs or finish reasons differ, oldest first, paged",
)
def divergent_pairs(
    request: Request,
    name: DeploymentName,
    who: Reader,
    conn: Conn,
    against: Annotated[
        Literal["candidate", "replay"],
        Query(description="compare the incumbent with the candidate, or with its own replay"),
    ] = "candidate",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="pairs per page")] = 50,
    cursor: Annotated[
        str | None, Query(max_length=200, description="`next_cursor` of the previous page")
    ] = None,
    since: Annotated[Time | None, Query(description="sent at or after (ISO 8601)")] = None,
    until: Annotated[Time | None, Query(description="sent before (ISO 8601)")] = None,
) -> PairPage:
    nats = near_tie_nats_of(deployment_row(conn, name).policy)
    after = queries.decode_cursor(cursor) if cursor else None
    since, until = utc_param(since, "since"), utc_param(until, "until")
    check_window(since, until)
    scan = queries.divergent_pairs(
        conn, name, against=against, after=after, since=since, until=until, limit=limit
    )
    rows = scan.rows
    items = []
    for row in rows:
        incumbent = {**_columns(row, "i_"), "request": row.request}
        items.append(
            DivergentPair(
                pair_id=row.pair_id,
                sent_at=row.i_sent_at,
                endpoint=row.endpoint,
                model=row.model,
                incumbent=_side_summary(row, "i_", who),
                other=_side_summary(row, "o_", who),
                divergence=compare(
                    incumbent, _columns(row, "o_"), content=who.sees_content, near_tie_nats=nats
                ),
            )
        )
    if who.sees_content and items:
        audit.content_read(
            who,
            request.url.path,
            name,
            pair_ids=[p.pair_id for p in items],
            since=since,
            until=until,
        )
    next_cursor = None
    if scan.resume is not None:
        next_cursor = queries.encode_cursor(scan.resume)
    elif scan.more and rows:
        last = rows[-1]
        next_cursor = queries.encode_cursor((last.i_sent_at, last.pair_id))
    return PairPage(
        deployment=name, against=against, limit=limit, items=items, next_cursor=next_cursor
    )


def _side(row: AnyRow, who: Principal) -> Side:
    fields = dict(row._mapping)
    fields["error"] = redact_error(
        fields.get("error"), str(fields.get("status")), content=who.sees_content
    )
    if not who.sees_content:
        fields["output_text"] = None
        fields["logprobs"] = None
    return Side.model_validate(fields)


def pair_detail(
    name: str, rows: list[AnyRow], who: Principal, near_tie_nats: float = NEAR_TIE_NATS
) -> PairDetail:
    by_role = {r.role: r for r in rows}
    first = by_role.get("incumbent", rows[0])
    prompt, parameters = split_request(first.request or {})
    divergence = {}
    if "incumbent" in by_role:
        for role in ("candidate", "replay"):
            other = by_role.get(role)
            if other is not None:
                divergence[role] = compare(
                    dict(first._mapping),
                    dict(other._mapping),
                    content=who.sees_content,
                    near_tie_nats=near_tie_nats,
                )
    return PairDetail(
        pair_id=first.pair_id,
        deployment=name,
        sent_at=min(r.sent_at for r in rows),
        endpoint=first.endpoint,
        model=first.model,
        prompt=prompt if who.sees_content else None,
        parameters=redact_parameters(parameters, content=who.sees_content),
        sides={role: _side(r, who) for role, r in by_role.items()},
        divergence=divergence,
    )


@router.get(
    "/deployments/{name}/pairs/{pair_id}",
    response_model=PairDetail,
    summary="One pair side by side",
    responses={
        200: {
            "content": {"text/html": {"schema": {"type": "string"}}},
            "description": "the pair as JSON, or an HTML page with the divergence marked",
        },
        403: problem_response("the HTML page needs the `content` scope"),
    },
)
def get_pair(
    request: Request,
    name: DeploymentName,
    pair_id: Annotated[uuid.UUID, Path(description="the pair's id (x-shadow-pair-id)")],
    who: Reader,
    conn: Conn,
    format: Annotated[Format | None, Query(description="`json` (default) or `html`")] = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> PairDetail | Response:
    nats = near_tie_nats_of(deployment_row(conn, name).policy)
    rows = list(queries.pair_exchanges(conn, name, pair_id))
    if not rows:
        raise NotFound(f"deployment {name!r} has no pair {pair_id}")
    html = wants_html(format, accept)
    if html and not who.sees_content:
        raise MissingScope(
            "the side-by-side page shows prompts and outputs: it needs the 'content' scope"
            " (the JSON form shows timings and divergence offsets without it)"
        )
    detail = pair_detail(name, rows, who, nats)
    if who.sees_content:
        audit.content_read(who, request.url.path, name, pair_ids=[pair_id])
    if html:
        return HTMLResponse(pair_page(detail), headers=PAGE_HEADERS)
    return detail
