"""The FastAPI application: :func:`create_app` wires the routers, auth and error handlers.

I/O is passed in: the caller hands a store engine (:func:`api.db.make_readonly_engine` in
production, any migrated engine in tests) and a :class:`~api.auth.TokenAuth`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from sqlalchemy import Engine, text

from api.auth import TokenAuth
from api.deps import reject_unknown_query
from api.errors import problem_handlers
from api.models import Health, problem_response
from api.routes import deployments, incidents, pairs, reports
from shadow_ab import __version__
from storage.errors import SchemaMissing, StorageError, translate

DESCRIPTION = """
Read-only access to a shadow-ab store: deployments, their go/no-go reports, engine incidents,
and the pairs where the candidate's output diverged from the incumbent's.

Authenticate with `Authorization: Bearer <token>`. Scopes: `read` (every endpoint: metadata,
reports, incidents, timings) and `content` (prompts, outputs and logprobs; without it those
fields are null). Errors are `application/problem+json`.
"""


V1_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: problem_response("no bearer token, or not a valid one"),
    403: problem_response("the token lacks a scope this request needs"),
    404: problem_response("unknown deployment (or report, or pair)"),
    422: problem_response("a parameter that is malformed or makes no sense"),
    503: problem_response("the store is unreachable or not migrated"),
}


def create_app(engine: Engine, auth: TokenAuth) -> FastAPI:
    app = FastAPI(
        title="shadow-ab query API",
        version=__version__,
        description=DESCRIPTION,
        docs_url="/docs",
        redoc_url=None,
        dependencies=[Depends(reject_unknown_query)],
    )
    app.state.engine = engine
    app.state.auth = auth
    problem_handlers(app)
    for module in (deployments, reports, incidents, pairs):
        app.include_router(module.router, prefix="/v1", responses=V1_RESPONSES)

    @app.get(
        "/healthz",
        response_model=Health,
        tags=["health"],
        summary="Liveness and store",
        responses={503: {"model": Health, "description": "the store is unreachable"}},
    )
    def healthz() -> Health | JSONResponse:
        try:
            with translate(), engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except StorageError as exc:
            # Unauthenticated: say what, not where (no host names or SQL).
            reason = "not migrated" if isinstance(exc, SchemaMissing) else "unreachable"
            body = Health(status="unavailable", database=reason)
            return JSONResponse(body.model_dump(), status_code=503)
        return Health(status="ok", database="ok")

    return app
