"""Bearer-token authentication and scopes.

Tokens come from :class:`api.settings.APISettings`. A presented token is compared with every
configured one by SHA-256 digest with :func:`hmac.compare_digest` (constant time, and the
same work whichever token matches or none), so response timing says nothing about tokens.

- no or malformed ``Authorization`` header, or an unknown token: 401 with
  ``WWW-Authenticate: Bearer``;
- a known token without the scope an endpoint needs: 403 naming the scope.

Every endpoint except ``/healthz`` and the docs needs ``read``; prompts and outputs are filled
in only for tokens with ``content`` (:attr:`Principal.sees_content`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import MissingScope, NotAuthenticated
from api.settings import Scope, TokenMap

REALM = "shadow-ab"

bearer = HTTPBearer(
    auto_error=False,
    description="A token from SHADOW_AB_API_TOKENS; scopes `read` and `content`.",
)


@dataclass(frozen=True)
class Principal:
    """Who is asking: the scopes of the presented token."""

    scopes: frozenset[Scope]
    token_id: str = "anonymous"
    """The token's id in the audit log (:func:`token_id`), never the token itself."""

    @property
    def sees_content(self) -> bool:
        return Scope.CONTENT in self.scopes


ANONYMOUS_DEV = Principal(scopes=frozenset(Scope))
"""Everyone, when the server runs with ``--no-auth``."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def token_id(digest: bytes) -> str:
    """A token's id for logs: the first 12 hex digits of its SHA-256 (not enough to find it)."""
    return digest.hex()[:12]


class TokenAuth:
    """Checks bearer tokens against the configured map; ``None`` means no authentication."""

    def __init__(self, tokens: TokenMap | None) -> None:
        self.enabled = tokens is not None
        self._entries = [(_digest(t), scopes) for t, scopes in (tokens or {}).items()]

    def authenticate(self, credentials: HTTPAuthorizationCredentials | None) -> Principal:
        if not self.enabled:
            return ANONYMOUS_DEV
        if credentials is None or not credentials.credentials:
            raise NotAuthenticated(
                "this endpoint needs a bearer token: send `Authorization: Bearer <token>`",
                headers={"WWW-Authenticate": f'Bearer realm="{REALM}"'},
            )
        presented = _digest(credentials.credentials)
        found: frozenset[Scope] | None = None
        for digest, scopes in self._entries:  # no early exit: same work for every token
            if hmac.compare_digest(presented, digest):
                found = scopes
        if found is None:
            raise NotAuthenticated(
                "the bearer token is not valid for this server",
                headers={"WWW-Authenticate": f'Bearer realm="{REALM}", error="invalid_token"'},
            )
        return Principal(scopes=found, token_id=token_id(presented))


def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> Principal:
    auth: TokenAuth = request.app.state.auth
    return auth.authenticate(credentials)


def require(scope: Scope) -> Callable[[Principal], Principal]:
    """A dependency that lets through only tokens holding ``scope`` (403 otherwise)."""

    def check(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
        if scope not in principal.scopes:
            raise MissingScope(
                f"this token lacks the {scope.value!r} scope this request needs",
                headers={
                    "WWW-Authenticate": (
                        f'Bearer realm="{REALM}", error="insufficient_scope", scope="{scope.value}"'
                    )
                },
            )
        return principal

    return check


Reader = Annotated[Principal, Depends(require(Scope.READ))]
"""A route parameter for any token with the ``read`` scope."""
