"""Settings of ``shadow-ab api``: flags, then ``SHADOW_AB_API_*`` / ``SHADOW_AB_*`` environment
variables, then defaults.

Tokens have no default: a token map comes from ``SHADOW_AB_API_TOKENS`` (JSON, token -> list of
scopes) or from the file named by ``SHADOW_AB_API_TOKENS_FILE`` (a JSON or YAML map, same shape),
or both (merged). Starting with neither fails with a sentence saying how to fix it, unless
``--no-auth`` asks for an open server explicitly (local development only: refused with a
``--host`` that is not a loopback address).

The database URL is ``SHADOW_AB_API_DATABASE_URL`` (meant for a read-only role, see
:mod:`api.roles`), falling back to the store's ``SHADOW_AB_DATABASE_URL``.
"""

from __future__ import annotations

import ipaddress
import json
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, PrivateAttr, field_validator, model_validator

from shadow_ab.settings import CommonSettings, normalize_database_url

MIN_TOKEN_LENGTH = 16


class Scope(StrEnum):
    """What a token may see."""

    READ = "read"
    """Metadata, reports, incidents, timings: every endpoint, prompts and outputs redacted."""
    CONTENT = "content"
    """Prompts, outputs and logprobs (the text fields are null without it)."""


TokenMap = dict[str, frozenset[Scope]]


def parse_token_map(raw: Any, source: str) -> TokenMap:
    """A token map from a parsed JSON/YAML object; ValueError naming ``source`` if malformed."""
    if not isinstance(raw, dict):
        raise ValueError(
            f"{source} must be a map of token -> list of scopes, e.g."
            ' {"<token>": ["read", "content"]}'
        )
    tokens: TokenMap = {}
    known = ", ".join(s.value for s in Scope)
    for token, scopes in raw.items():
        if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"{source}: every token must be a string of at least {MIN_TOKEN_LENGTH}"
                " characters (generate one with `python -c 'import secrets;"
                " print(secrets.token_urlsafe(32))'`)"
            )
        if isinstance(scopes, str):
            scopes = [s.strip() for s in scopes.split(",") if s.strip()]
        if not isinstance(scopes, list | tuple) or not scopes:
            raise ValueError(f"{source}: a token's scopes must be a non-empty list ({known})")
        try:
            tokens[token] = frozenset(Scope(s) for s in scopes)
        except ValueError:
            bad = [s for s in scopes if s not in {x.value for x in Scope}]
            raise ValueError(f"{source}: unknown scope(s) {bad}; known scopes: {known}") from None
    return tokens


def read_token_file(path: Path) -> TokenMap:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the tokens file {path}: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"the tokens file {path} is not JSON or YAML: {exc}") from None
    return parse_token_map(raw, f"tokens file {path}")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


class APISettings(CommonSettings):
    """Settings of ``shadow-ab api``; environment names are ``SHADOW_AB_<FIELD>``."""

    api_host: str = Field(default="127.0.0.1", description="address to listen on")
    api_port: int = Field(default=8600, ge=0, le=65535, description="port to listen on")
    api_database_url: str | None = Field(
        default=None,
        description="store URL for the API (a read-only role); default SHADOW_AB_DATABASE_URL",
    )
    api_tokens: str | None = Field(
        default=None,
        repr=False,
        description='JSON map token -> scopes, e.g. {"<token>": ["read", "content"]}',
    )
    api_tokens_file: Path | None = Field(
        default=None, description="JSON or YAML file holding the same map (merged with the above)"
    )
    api_no_auth: bool = Field(
        default=False, description="serve without authentication (local development only)"
    )
    api_statement_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="PostgreSQL: cancel a query running longer"
    )

    _token_map: TokenMap = PrivateAttr(default_factory=dict)

    @field_validator("api_database_url")
    @classmethod
    def _known_api_dialect(cls, v: str | None) -> str | None:
        return normalize_database_url(v) if v else None

    @model_validator(mode="after")
    def _usable(self) -> APISettings:
        self._token_map = self._load_tokens()
        if self.api_no_auth and not is_loopback(self.api_host):
            raise ValueError(
                f"--no-auth with --host {self.api_host}: anyone who reaches that address would"
                " read every prompt and output. Listen on 127.0.0.1 (--host 127.0.0.1) for local"
                " development, or configure tokens (SHADOW_AB_API_TOKENS or"
                " SHADOW_AB_API_TOKENS_FILE) and drop --no-auth"
            )
        if not self._token_map and not self.api_no_auth:
            raise ValueError(
                "no API tokens configured: set SHADOW_AB_API_TOKENS to a JSON map such as"
                ' {"<token>": ["read"]} or SHADOW_AB_API_TOKENS_FILE to a file holding one'
                " (or pass --no-auth for an unauthenticated local development server)"
            )
        return self

    def _load_tokens(self) -> TokenMap:
        tokens: TokenMap = {}
        if self.api_tokens and self.api_tokens.strip():
            try:
                raw = json.loads(self.api_tokens)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"SHADOW_AB_API_TOKENS is not valid JSON ({exc.msg} at character"
                    f' {exc.pos}): write it as {{"<token>": ["read"]}}'
                ) from None
            tokens = parse_token_map(raw, "SHADOW_AB_API_TOKENS")
        if self.api_tokens_file is not None:
            tokens.update(read_token_file(self.api_tokens_file))
        return tokens

    @property
    def token_map(self) -> TokenMap:
        """Configured tokens and their scopes (empty only with ``api_no_auth``)."""
        return dict(self._token_map)

    @property
    def store_url(self) -> str:
        """The URL the API connects with."""
        return self.api_database_url or self.database_url
