"""Which requests the mirror's client port takes, and the canonical path it routes them by.

A reverse proxy in front of an engine passes on what clients of that engine's API need, not
everything the engine serves: vLLM's server also has admin endpoints (``/sleep``,
``/reset_prefix_cache``, LoRA loading, profiling, ``/metrics``) that clients must not reach,
and TRACE is never passed on. So the client port answers:

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: the shadowed, recorded routes;
- the pass-through allow-list (``routes`` in the settings, :data:`DEFAULT_PASSTHROUGH` by
  default): the incumbent's answer, not shadowed, not recorded;
- anything else: 404, or 405 with ``Allow`` for a known path asked with another method; 400
  for a path with control characters. None of these reaches an engine.

Paths are made canonical before routing (:func:`canonical_path`), the way nginx does
(``merge_slashes``, dot segments resolved, percent-encoding decoded), and the canonical path
is what the engines get: ``//v1/chat/./completions`` or ``/v1/chat/%2e/completions`` is
shadowed and recorded as ``/v1/chat/completions``, and the incumbent sees that path, never the
alias. A trailing slash is dropped too (``/v1/models/`` is ``/v1/models``).

Errors: :class:`ValueError` from :func:`parse_route` for an entry that is not ``METHOD /path``.
"""

from __future__ import annotations

import re
from urllib.parse import quote

GENERATE_PATHS = ("/v1/chat/completions", "/v1/completions")
DEFAULT_PASSTHROUGH = (
    "GET /v1/models",
    "GET /v1/models/*",
    "GET /health",
    "GET /version",
)
"""What the OpenAI clients of a vLLM or TensorRT-LLM server call besides the two generate
routes (``/health`` and ``/version`` for clients' own checks)."""

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods a pass-through entry may name (never TRACE or CONNECT)."""

_ROUTE = re.compile(r"^([A-Za-z]+)\s+(/\S*)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SAFE = "/:@!$&'()*+,;=-._~"


def parse_route(entry: str) -> tuple[str, str]:
    """``"GET /v1/models"`` -> ``("GET", "/v1/models")``; a path ending in ``/*`` matches
    everything under it."""
    found = _ROUTE.match(entry.strip())
    if found is None:
        raise ValueError(f"route {entry!r} is not 'METHOD /path' (e.g. 'GET /v1/models')")
    method, path = found.group(1).upper(), found.group(2)
    if method not in METHODS:
        raise ValueError(
            f"route {entry!r}: method {method} cannot be passed through"
            f" (allowed: {', '.join(sorted(METHODS))})"
        )
    base = path.removesuffix("/*")
    if canonical_path(base) != base or "*" in base:
        raise ValueError(
            f"route {entry!r}: give the canonical path ({canonical_path(base)!r}; '*' only as"
            " the last segment)"
        )
    return method, path


def canonical_path(path: str) -> str | None:
    """``path`` (already percent-decoded) with empty and ``.`` segments removed and ``..``
    resolved (RFC 3986 section 5.2.4, never above the root); None when it holds control
    characters."""
    if _CONTROL.search(path):
        return None
    segments: list[str] = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if segments:
                segments.pop()
            continue
        segments.append(seg)
    return "/" + "/".join(segments)


def quoted(path: str) -> str:
    """A canonical path as it goes on the wire (percent-encoded where it must be)."""
    return quote(path, safe=_SAFE)


class Router:
    """The pass-through allow-list: :meth:`allowed` says whether a method and canonical path
    may be passed on, and if not whether the path is known (405) or not (404)."""

    def __init__(self, entries: list[str] | tuple[str, ...]) -> None:
        self.exact: dict[str, set[str]] = {}
        self.prefixes: list[tuple[str, set[str]]] = []
        for method, path in (parse_route(e) for e in entries):
            if path.endswith("/*"):
                prefix = path[:-1]
                for known, methods in self.prefixes:
                    if known == prefix:
                        methods.add(method)
                        break
                else:
                    self.prefixes.append((prefix, {method}))
            else:
                self.exact.setdefault(path, set()).add(method)
        for path in GENERATE_PATHS:
            self.exact.setdefault(path, set()).add("POST")

    def methods(self, path: str) -> set[str]:
        """The methods allowed on ``path`` (empty: an unknown path)."""
        found = set(self.exact.get(path, ()))
        for prefix, methods in self.prefixes:
            if path.startswith(prefix) and len(path) > len(prefix):
                found |= methods
        return found
