"""The read-only query API over the store (``shadow-ab api``).

Modules: :mod:`api.app` (the FastAPI app), :mod:`api.routes` (one router per resource),
:mod:`api.auth` (bearer tokens, scopes), :mod:`api.settings`, :mod:`api.db` (read-only
sessions), :mod:`api.roles` (a SELECT-only PostgreSQL role), :mod:`api.queries` (SQL),
:mod:`api.incidents` and :mod:`api.divergence` (adapters over the evaluator),
:mod:`api.redact`, :mod:`api.html`, :mod:`api.errors` (problem details), :mod:`api.cli`.
See ``api/README.md``.
"""

from api.app import create_app
from api.auth import Principal, TokenAuth
from api.db import make_readonly_engine
from api.roles import create_readonly_role
from api.settings import APISettings, Scope

__all__ = [
    "APISettings",
    "Principal",
    "Scope",
    "TokenAuth",
    "create_app",
    "create_readonly_role",
    "make_readonly_engine",
]
