"""Errors of the query API, and how they reach clients: JSON problem details (RFC 9457).

::

    APIError                    any error the API answers itself (status, title, detail)
    ├── NotAuthenticated        401: no bearer token, or not a configured one
    ├── MissingScope            403: the token lacks a scope the request needs
    ├── NotFound                404: unknown deployment, report or pair (named in the detail)
    └── BadParameter            422: a query parameter that parses but makes no sense

Store failures are translated at the one boundary in :func:`problem_handlers`:
:class:`storage.errors.StoreUnavailable` and an unmigrated store are 503, any other storage
error 500, each with a sentence and never the SQL or a stack trace (the log has the
details). FastAPI's own request validation errors become 422 problems listing each bad
parameter; any other exception a 500 problem (never a plain-text answer).
"""

from __future__ import annotations

import http
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from storage.errors import SchemaMissing, StorageError, StoreUnavailable, classify

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"


class APIError(Exception):
    status = 500
    title = "Internal Server Error"

    def __init__(self, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class NotAuthenticated(APIError):
    status = 401
    title = "Unauthorized"


class MissingScope(APIError):
    status = 403
    title = "Forbidden"


class NotFound(APIError):
    status = 404
    title = "Not Found"


class BadParameter(APIError):
    status = 422
    title = "Unprocessable Content"


def problem(
    status: int,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def _api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return problem(exc.status, exc.title, exc.detail, exc.headers)


def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "loc": [str(p) for p in err.get("loc", ())],
            "msg": str(err.get("msg", "")),
            "type": str(err.get("type", "")),
        }
        for err in exc.errors()
    ]
    where = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5])
    return problem(422, "Unprocessable Content", f"invalid request: {where}", errors=errors)


def _title(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers) if exc.headers else None
    return problem(exc.status_code, _title(exc.status_code), str(exc.detail), headers)


def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # Anything no other handler took: a problem, never a plain-text trace (the log has it).
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return problem(
        500,
        "Internal Server Error",
        "the API failed to answer this request (see the API's log); retry, or report it",
    )


def _storage_error(_request: Request, exc: Exception) -> JSONResponse:
    # The client gets a sentence, never the SQL (it may carry prompts); the log gets the rest.
    if isinstance(exc, SQLAlchemyError):
        exc = classify(exc)
    log.error("store error: %s", exc)
    if isinstance(exc, StoreUnavailable):
        return problem(503, "Service Unavailable", "the store is unreachable; try again later")
    if isinstance(exc, SchemaMissing):
        return problem(
            503, "Service Unavailable", "the store is not migrated: run `shadow-ab db upgrade`"
        )
    return problem(500, "Internal Server Error", "the store failed to answer (see the API's log)")


def problem_handlers(app: FastAPI) -> None:
    """Install the handlers that turn every error into a problem-details response."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(StorageError, _storage_error)
    app.add_exception_handler(SQLAlchemyError, _storage_error)
    app.add_exception_handler(Exception, _internal_error)
