"""The audit trail of content reads: one structured log line per API answer that showed
prompts or outputs (a token with the ``content`` scope reading a pair, a page of divergent pairs
or a report whose body holds text).

Each line is one JSON object on the ``shadow_ab.audit`` logger (INFO), so a log pipeline can
keep it apart and index it::

    {"event": "content_read", "time": "2026-12-01T18:30:00+00:00", "token": "3f9a1c2b7d4e",
     "route": "/v1/deployments/d/pairs/<id>", "deployment": "d", "pair_ids": ["<id>"],
     "since": null, "until": null, "report_id": null}

``token`` is the token's id (the first 12 hex digits of its SHA-256; never the token), or
``anonymous`` on a ``--no-auth`` server.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import TextIO

import orjson

from api.auth import Principal
from shadow_ab.records import utcnow

log = logging.getLogger("shadow_ab.audit")


def content_read(
    who: Principal,
    route: str,
    deployment: str,
    *,
    pair_ids: Iterable[uuid.UUID] = (),
    since: datetime | None = None,
    until: datetime | None = None,
    report_id: int | None = None,
) -> None:
    """Log that ``who`` read prompts or outputs of ``deployment`` through ``route``."""
    line = {
        "event": "content_read",
        "time": utcnow().isoformat(),
        "token": who.token_id,
        "route": route,
        "deployment": deployment,
        "pair_ids": [str(p) for p in pair_ids],
        "since": since.isoformat() if since else None,
        "until": until.isoformat() if until else None,
        "report_id": report_id,
    }
    log.info("%s", orjson.dumps(line).decode())


def configure(stream: TextIO | None = None) -> None:
    """Send the audit lines to ``stream`` (default stderr), one JSON object a line, whatever the
    rest of the logging does (uvicorn configures only its own loggers). Idempotent."""
    if log.handlers:
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
