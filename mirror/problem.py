"""The body of every error the mirror answers itself: problem details (RFC 9457) that also
carry an OpenAI-style ``error`` member, so OpenAI SDKs show the message and tools that speak
problem+json read ``type``, ``title``, ``status`` and ``detail``.

Errors: none (pure).
"""

from __future__ import annotations

import http
from typing import Any

import orjson

PROBLEM_JSON = b"application/problem+json"

_OPENAI_TYPE = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "RequestTooLarge",
    431: "invalid_request_error",
    502: "BadGateway",
    503: "service_unavailable",
    504: "GatewayTimeout",
}


def problem_body(status: int, detail: str, err_type: str | None = None, **extra: Any) -> bytes:
    """``{"type", "title", "status", "detail", "error": {message, type, param, code}}``."""
    try:
        title = http.HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    return orjson.dumps(
        {
            "type": "about:blank",
            "title": title,
            "status": status,
            "detail": detail,
            **extra,
            "error": {
                "message": detail,
                "type": err_type or _OPENAI_TYPE.get(status, "error"),
                "param": None,
                "code": status,
            },
        }
    )
